"""Readers for the input formats: each record becomes chat messages (or plain text), with
its `file:line` so that every error can point at it.

- alpaca: `instruction`, optional `input`, `output`, optional `system` and `history` (the
  earlier [query, response] turns); a JSON array or JSONL.
- sharegpt: `conversations` of `{from, value}` (human, gpt, system) or `messages` of
  `{role, content}` (user, assistant, system); multi-turn; optional `system`; JSON array or JSONL.
- text: JSONL with `text`, for continued pre-training.
Any of them also as CSV, TSV, Excel (.xlsx) or Parquet, one record a row (tables.py), and
under other key or column names with data.columns. These are LLaMA-Factory's alpaca and
sharegpt columns (its data/README.md), read into the turns its converter builds
(src/llamafactory/data/converter.py), but for the instruction/input join ("\n\n" here, "\n"
there); `tools` (function calling) is refused, and a column no format reads is noted.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from ..common.console import note
from .chat_template import Message
from .encodings import decode_file, text_lines
from .errors import RecordError
from .record_kind import RecordKind
from .tables import ReadOptions, is_table, map_columns, table_records
from .turn_tags import role_of, turn_keys, unknown_role

# What a bad-record error ends with: how to train on the rest instead.
SKIP_HINT = "data.on_bad_record=skip (prepare-data --on-bad-record skip) drops such records"


def with_skip_hint(error: RecordError) -> RecordError:
    """A bad record's error with SKIP_HINT; not a record of another format, which wants
    --format, not dropping, nor one that names the way out already (data/pairs.py's)."""
    if " read as " in error.reason or "data.on_bad_record" in str(error):
        return error
    return RecordError(f"{error}; {SKIP_HINT}", error.reason)


@dataclass
class Record:
    where: str  # file:line
    messages: Optional[List[Message]] = None  # chat formats
    text: Optional[str] = None  # text format


def _json_error(exc: json.JSONDecodeError, one_line: bool = False) -> str:
    """The decoder's message with the position it refers to ("Unterminated string starting
    at" is cut off without it); `one_line`: a JSONL line, where only the column counts."""
    if not exc.msg.endswith(" at"):
        return exc.msg
    return f"{exc.msg} column {exc.colno}" if one_line else f"{exc.msg} line {exc.lineno} column {exc.colno}"


def _array_records(path: Path, text: str) -> Iterator[Tuple[int, object]]:
    """(line the record starts on, parsed record) for each element of a JSON array, so a
    bad record is named by its line as in JSONL. A syntax error ends the file: the decoder
    cannot tell where the next record starts."""
    decoder = json.JSONDecoder()
    pos, line, counted = text.index("[") + 1, 1, 0

    def skip_space(at: int) -> int:
        while at < len(text) and text[at] in " \t\r\n":
            at += 1
        return at

    def malformed(at: int, what: str) -> RecordError:
        exc = json.JSONDecodeError(what, text, at)
        return RecordError(f"{path}:{exc.lineno}:{exc.colno}: malformed JSON array ({_json_error(exc)})")

    pos = skip_space(pos)
    if text.startswith("]", pos):
        return
    while True:
        line += text.count("\n", counted, pos)
        counted = pos
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise RecordError(f"{path}:{exc.lineno}:{exc.colno}: malformed JSON array ({_json_error(exc)})") from None
        except RecursionError:
            raise RecordError(f"{path}:{line}: a record nested too deeply to read (thousands of levels)") from None
        yield line, item
        pos = skip_space(pos)
        if text.startswith("]", pos):
            if text[pos + 1:].strip():
                raise malformed(skip_space(pos + 1), "Extra data after the array")
            return
        if not text.startswith(",", pos):
            raise malformed(pos, "Expecting ',' delimiter")
        pos = skip_space(pos + 1)


def _raw_records(path: Path, options: ReadOptions, first_line: int = 1) -> Iterator[Tuple[int, object]]:
    """(line or row, parsed record or a RecordError) for each record of a file from line (or
    row) `first_line` on, its keys mapped by data.columns."""
    if is_table(path):
        return ((row, record) for row, record in table_records(path, options) if row >= first_line)
    return ((line, map_columns(raw, options.columns, options.exclusive))
            for line, raw in _json_records(path, options.encoding, first_line))


def _json_records(path: Path, encoding: str, first_line: int = 1) -> Iterator[Tuple[int, object]]:
    """(line number, parsed JSON or a RecordError) for each record of a JSON array or JSONL
    file from line `first_line` on; a malformed JSONL line is yielded as an error so skip
    mode can go on."""
    # JSONL streams a line at a time, so memory does not grow with the file (#43); a JSON
    # array is one value, read whole. Lines end at \n, \r\n or \r, never inside a JSON string,
    # which escapes them (data/encodings.py text_lines). A JSONL line before `first_line` is
    # not parsed: prepare-data's worker processes start at their range's first record.
    lines, first = text_lines(path, encoding), True
    for lineno, line in enumerate(lines, start=1):
        if lineno < first_line and not first:
            continue
        line = line[:-1] if line.endswith("\n") else line  # a newline in an open string is no control character
        if not line.strip():
            continue
        if first and line.lstrip().startswith("["):
            lines.close()
            yield from ((n, raw) for n, raw in _array_records(path, decode_file(path, encoding)) if n >= first_line)
            return
        first = False
        if lineno < first_line:
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as exc:
            yield lineno, RecordError(f"{path}:{lineno}:{exc.colno}: malformed JSON ({_json_error(exc, True)}); expected "
                                      f"one object per line", "malformed JSON")
        except RecursionError:
            yield lineno, RecordError(f"{path}:{lineno}: a record nested too deeply to read (thousands of levels); "
                                      f"expected one object per line", "malformed JSON")


def _string(record: dict, key: str, where: str, required: bool, what: str = "", mapped: bool = True) -> str:
    """record[key] as a string; `what` names an empty required value in the skip report
    (e.g. "empty answer"); a missing key is reported as missing, not as empty, and, for a
    key data.columns can map (`mapped`: not a turn's), with the names the record has."""
    if required and key not in record:
        has = (f" (the record has {', '.join(map(repr, record)) or 'no field'}; data.columns: {{{key}: NAME}} "
               f"reads it from another)") if mapped else ""
        raise RecordError(f"{where}: field '{key}' is missing; expected a non-empty string{has}", f"missing '{key}'")
    value = record.get(key, "")
    if not isinstance(value, str):
        raise RecordError(f"{where}: field '{key}' must be a string, got {type(value).__name__}",
                          "non-string field")
    if required and not value.strip():
        raise RecordError(f"{where}: field '{key}' is empty; expected a non-empty string",
                          what or f"empty '{key}'")
    return value


def _object(record: object, where: str, expected: str) -> dict:
    if not isinstance(record, dict):
        raise RecordError(f"{where}: expected a JSON object with {expected}", "not an object")
    return record


def _no_tools(record: dict, where: str) -> None:
    """LLaMA-Factory writes `tools` into the system prompt for function calling, which this
    harness does not train: such a record is refused rather than trained without them. The
    JSON text "[]" is no tools (LLaMA-Factory's demo data writes it so)."""
    tools = record.get("tools")
    if tools not in (None, "", [], {}) and not (isinstance(tools, str) and tools.strip() in ("[]", "{}")):
        raise RecordError(f"{where}: field 'tools' holds tool definitions (function calling), which llama-npu does "
                          f"not train; remove the column or leave it empty", "tool definitions")


def _history(record: dict, where: str) -> List[Message]:
    """The earlier turns of an alpaca record: `history`, a list of [query, response] pairs,
    as user and assistant turns (every response is a target, as in LLaMA-Factory without
    mask_history)."""
    history = record.get("history")
    if history in (None, ""):
        return []
    if not isinstance(history, list):
        raise RecordError(f"{where}: field 'history' must be a list of [query, response] pairs, got "
                          f"{type(history).__name__}", "malformed history")
    turns: List[Message] = []
    for i, pair in enumerate(history, start=1):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(t, str) and t.strip() for t in pair)):
            raise RecordError(f"{where}: history turn {i} must be a [query, response] pair of non-empty strings, got "
                              f"{json.dumps(pair, ensure_ascii=False)[:80]}", "malformed history")
        turns += [("user", pair[0]), ("assistant", pair[1])]
    return turns


def alpaca_prompt(record: dict, where: str) -> List[Message]:
    """The system, history and user turns of an alpaca record (an SFT record's or a
    preference pair's), in LLaMA-Factory's order."""
    instruction = _string(record, "instruction", where, required=True)
    extra = _string(record, "input", where, required=False)
    system = _string(record, "system", where, required=False)
    _no_tools(record, where)
    # "\n\n" where LLaMA-Factory joins with "\n": kept, so that runs on existing data do not move
    prompt = f"{instruction}\n\n{extra}" if extra.strip() else instruction
    messages: List[Message] = [("system", system)] if system.strip() else []
    return messages + _history(record, where) + [("user", prompt)]


def parse_alpaca(record: object, where: str, options: ReadOptions = ReadOptions()) -> Record:
    record = _object(record, where, "'instruction' and 'output'")
    prompt = alpaca_prompt(record, where)
    answer = _string(record, "output", where, required=True, what="empty answer")
    return Record(where, messages=prompt + [("assistant", answer)])


def _turns_of(record: dict, where: str) -> Tuple[str, list]:
    """(the turns' key, the turns) of a ShareGPT record: `conversations`, else `messages`
    (data.columns maps LLaMA-Factory's `messages` column onto either: the turns' own keys, or
    data.tags, decide how a turn is read, data/turn_tags.py)."""
    key = "conversations" if "conversations" in record else "messages" if "messages" in record else None
    if key is None:
        raise RecordError(f"{where}: expected a 'conversations' list of {{from, value}} or a 'messages' "
                          f"list of {{role, content}}", "missing 'conversations'")
    if not isinstance(record[key], list) or not record[key]:
        raise RecordError(f"{where}: '{key}' must be a non-empty list", "empty conversation")
    return key, record[key]


def read_turn(turn: object, where: str, tags: Dict[str, str]) -> Tuple[str, dict, str]:
    """(our role, the turn, its text's key) of one turn; a function-calling turn is refused."""
    role_key, text_key = turn_keys(turn if isinstance(turn, dict) else {}, tags)
    turn = _object(turn, where, f"'{role_key}' and '{text_key}'")
    role = role_of(turn.get(role_key), tags)
    if role is None:
        raise unknown_role(where, turn.get(role_key), tags)
    if role == "tool" or turn.get("tool_calls"):  # tool_calls: an OpenAI assistant turn calling a function
        raise RecordError(f"{where}: a {turn[role_key]!r} turn {'calling a tool ' if role != 'tool' else ''}is "
                          f"function calling, which llama-npu does not train", "function calling")
    return role, turn, text_key


def sharegpt_turns(record: dict, where: str, options: ReadOptions = ReadOptions(), last: str = "assistant",
                   why: str = "") -> List[Message]:
    """The turns of a ShareGPT record's `conversations` or `messages`, each checked, the
    last one `last`'s (a pair's history ends with the user's; `why` says so)."""
    _, turns = _turns_of(record, where)
    messages: List[Message] = []
    for i, turn in enumerate(turns):
        role, turn, text_key = read_turn(turn, f"{where} turn {i + 1}", options.tags)
        # An empty user turn would train the model to answer nothing in particular.
        content = _string(turn, text_key, f"{where} turn {i + 1}", required=role != "system",
                          what=f"empty {role} turn" if role == "user" else "empty answer", mapped=False)
        if role == "system" and i != 0:
            raise RecordError(f"{where} turn {i + 1}: a system turn must come first", "misplaced system turn")
        messages.append((role, content))
    system = _string(record, "system", where, required=False)  # LLaMA-Factory's column; a system turn wins
    if system.strip() and messages[0][0] != "system":
        messages.insert(0, ("system", system))
    _no_tools(record, where)
    if messages[-1][0] != last:
        article = "an" if messages[-1][0] == "assistant" else "a"
        raise RecordError(f"{where}: the conversation ends with {article} {messages[-1][0]} turn; expected it to "
                          f"end with the {last}{why}", f"no final {last} turn")
    return messages


def parse_sharegpt(record: object, where: str, options: ReadOptions = ReadOptions()) -> Record:
    record = _object(record, where, "'conversations' or 'messages'")
    return Record(where, messages=sharegpt_turns(record, where, options))


def parse_text(record: object, where: str, options: ReadOptions = ReadOptions()) -> Record:
    record = _object(record, where, "'text'")
    return Record(where, text=_string(record, "text", where, required=True))


PARSERS = {"alpaca": parse_alpaca, "sharegpt": parse_sharegpt, "text": parse_text}
# The keys that give each format away, to say why a file read with the wrong --format fails.
FORMAT_KEYS = {"alpaca": ("instruction",), "sharegpt": ("conversations", "messages"), "text": ("text",)}


# The keys each format reads; a file's other columns are named once, as unread
# (LLaMA-Factory's `tools` is read to be refused).
READ_KEYS = {"alpaca": {"instruction", "input", "output", "system", "history", "tools"},
             "sharegpt": {"conversations", "messages", "system", "tools"}, "text": {"text"}}
# The SFT objective's records (objectives/sft.py), the readers' default kind.
SFT_RECORDS = RecordKind("SFT records", PARSERS, READ_KEYS)


def first_record_is(path: Path, kind: RecordKind, options: ReadOptions = ReadOptions()) -> bool:
    """Whether a file's first record, read with `options`, is of `kind` (eval --data scores
    such files by their objective)."""
    for _, raw in _raw_records(Path(path), options):
        return kind.is_record(raw)
    return False


def _wrong_format(raw: object, fmt: str, error: RecordError, kind: RecordKind) -> RecordError:
    """`error`, or, when the record is another objective's or carries another format's keys,
    an error saying so."""
    misread = kind.misread_error(raw, str(error).split(": ", 1)[0])
    if misread is not None:
        return misread
    if not isinstance(raw, dict) or any(key in raw for key in FORMAT_KEYS[fmt]):
        return error
    for other, keys in FORMAT_KEYS.items():
        found = [key for key in keys if key in raw]
        if other != fmt and found:
            where = str(error).split(": ", 1)[0]
            article = "an" if other[0] in "aeiou" else "a"
            return RecordError(f"{where}: read as {fmt}, but the record has '{found[0]}', {article} {other} field: "
                               f"set data.format: {other} in the recipe (prepare-data: --format {other})",
                               f"{other} record read as {fmt}")
    return error


def detect_format(path: Path, options: ReadOptions = ReadOptions()) -> str:
    """alpaca / sharegpt / text from the keys of a file's first record (eval and plan
    --write-recipe take files without a --format)."""
    path = Path(path)
    if not path.is_file():
        raise RecordError(f"{path}: file not found")
    for lineno, raw in _raw_records(path, options):
        if isinstance(raw, RecordError):
            raise raw
        keys = set(raw) if isinstance(raw, dict) else set()
        for fmt, format_keys in FORMAT_KEYS.items():
            if keys & set(format_keys):
                return fmt
        raise RecordError(f"{path}:{lineno}: the record has keys {sorted(keys)}; expected 'instruction' (alpaca), "
                          f"'conversations' or 'messages' (sharegpt) or 'text' (text)")
    raise RecordError(f"{path}: no records (empty input)")


def iter_records(paths, fmt: str, options: ReadOptions = ReadOptions(), kind: Optional[RecordKind] = None,
                 on_unread: Optional[Callable[[Path, List[str]], None]] = None,
                 first_line: int = 1) -> Iterator[Record | RecordError]:
    """Every record of every file, in order, the first file's from line (or row)
    `first_line` on; a bad record is yielded as its RecordError. A missing, empty or
    undecodable file raises at once. `kind`: the records an objective reads (SFT_RECORDS;
    objectives/ records_of). `on_unread(path, keys)`: told, after each file, the keys of its
    records that the format does not read."""
    kind = kind or SFT_RECORDS
    parse = kind.parsers[fmt]
    reads = kind.read_keys.get(fmt, set())
    for index, path in enumerate(map(Path, paths)):
        if not path.is_file():
            raise RecordError(f"{path}: file not found")
        count, unread = 0, {}
        for lineno, raw in _raw_records(path, options, first_line if index == 0 else 1):
            count += 1
            if isinstance(raw, RecordError):
                yield raw
                continue
            if isinstance(raw, dict):
                unread.update(dict.fromkeys(key for key in raw if key not in reads))
            try:
                yield parse(raw, f"{path}:{lineno}", options)
            except RecordError as exc:
                yield _wrong_format(raw, fmt, exc, kind)
        if count == 0:
            raise RecordError(f"{path}: no records (empty input)")
        if unread and on_unread:
            on_unread(path, list(unread))


def unread_note(fmt: str, kind: RecordKind) -> Callable[[Path, List[str]], None]:
    """on_unread for iter_records: a note naming a file's unread columns and what is read."""
    reads = sorted(kind.read_keys[fmt] - {"tools"})

    def named(path: Path, keys: List[str]) -> None:
        note(f"{path}: {'column' if len(keys) == 1 else 'columns'} {', '.join(map(repr, keys))} not read ({fmt} "
             f"reads {', '.join(reads)}; data.columns: {{KEY: COLUMN}} reads a column as one of them)")
    return named


FIRST_LINES_KEPT = 5


@dataclass
class SkipReport:
    """Skipped records counted by reason, with where the first few of each are."""
    by_reason: Dict[str, dict] = field(default_factory=dict)

    def add(self, error: RecordError) -> None:
        entry = self.by_reason.setdefault(error.reason, {"count": 0, "first": []})
        entry["count"] += 1
        if len(entry["first"]) < FIRST_LINES_KEPT:
            entry["first"].append(str(error).split(": ", 1)[0])

    @property
    def total(self) -> int:
        return sum(e["count"] for e in self.by_reason.values())

    def describe(self) -> str:
        return "; ".join(f"{e['count']} x {reason} (first at {', '.join(e['first'])})"
                         for reason, e in self.by_reason.items())


def read_dataset(paths, fmt: str, on_bad_record: str = "error",
                 options: ReadOptions = ReadOptions(),
                 kind: Optional[RecordKind] = None) -> Tuple[List[Record], SkipReport]:
    """All good records; a bad one stops the read (error) or is counted and left out (skip).
    Train reads through here, prepare-data through good_records, the pre-flight through
    iter_records."""
    skipped = SkipReport()
    return list(good_records(paths, fmt, on_bad_record, skipped, options, kind)), skipped


def good_records(paths, fmt: str, on_bad_record: str, skipped: SkipReport, options: ReadOptions = ReadOptions(),
                 kind: Optional[RecordKind] = None, name_unread: bool = True, first_line: int = 1) -> Iterator[Record]:
    """The good records, streamed (the first file's from line `first_line` on); a bad one
    stops the read (error) or is counted in `skipped` and left out (skip). With
    `name_unread`, a file's columns that nothing reads are named in a note (prepare-data
    reads its files twice and names them on one pass)."""
    on_unread = unread_note(fmt, kind or SFT_RECORDS) if name_unread else None
    for item in iter_records(paths, fmt, options, kind, on_unread, first_line):
        if isinstance(item, RecordError):
            if on_bad_record == "error":
                raise with_skip_hint(item)
            skipped.add(item)
        else:
            yield item


def read_records(paths, fmt: str = "alpaca", options: ReadOptions = ReadOptions(),
                 kind: Optional[RecordKind] = None) -> List[Record]:
    """All records, stopping at the first bad one."""
    return read_dataset(paths, fmt, options=options, kind=kind)[0]
