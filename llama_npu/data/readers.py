"""Readers for the input formats: each record becomes chat messages (or plain text), with
its `file:line` so that every error can point at it.

- alpaca: `instruction`, optional `input`, `output`, optional `system`; a JSON array or JSONL.
- sharegpt: `conversations` of `{from, value}` (human, gpt, system) or `messages` of
  `{role, content}` (user, assistant, system); multi-turn; JSON array or JSONL.
- text: JSONL with `text`, for continued pre-training.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

from .chat_template import Message


class RecordError(ValueError):
    """A bad input record or file. `reason` is a short key for the skip report."""

    def __init__(self, message: str, reason: str = "unreadable file"):
        super().__init__(message)
        self.reason = reason


@dataclass
class Record:
    where: str  # file:line
    messages: Optional[List[Message]] = None  # chat formats
    text: Optional[str] = None  # text format


def read_text(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")  # a UTF-8 BOM is accepted
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise RecordError(f"{path}:{line}: not UTF-8 (byte offset {exc.start}); if it is GBK, convert it "
                          f"first: iconv -f GBK -t UTF-8 {path} > {path.stem}.utf8{path.suffix}") from None


def _raw_records(path: Path) -> Iterator[Tuple[int, object]]:
    """(line number, parsed JSON or a RecordError) for each record of a JSON array or JSONL
    file; a malformed JSONL line is yielded as an error so skip mode can go on."""
    text = read_text(path)
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RecordError(f"{path}:{exc.lineno}:{exc.colno}: malformed JSON array ({exc.msg})") from None
        # A JSON array has no per-record line; report the record's index (1-based) instead.
        yield from enumerate(items, start=1)
        return
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as exc:
            yield lineno, RecordError(f"{path}:{lineno}:{exc.colno}: malformed JSON ({exc.msg}); expected one "
                                      f"object per line", "malformed JSON")


def _string(record: dict, key: str, where: str, required: bool, what: str = "") -> str:
    """record[key] as a string; `what` names an empty required value in the skip report
    (e.g. "empty answer"); a missing key is reported as missing, not as empty."""
    if required and key not in record:
        raise RecordError(f"{where}: field '{key}' is missing; expected a non-empty string", f"missing '{key}'")
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


def parse_alpaca(record: object, where: str) -> Record:
    record = _object(record, where, "'instruction' and 'output'")
    instruction = _string(record, "instruction", where, required=True)
    extra = _string(record, "input", where, required=False)
    answer = _string(record, "output", where, required=True, what="empty answer")
    system = _string(record, "system", where, required=False)
    prompt = f"{instruction}\n\n{extra}" if extra.strip() else instruction
    messages: List[Message] = [("system", system)] if system.strip() else []
    return Record(where, messages=messages + [("user", prompt), ("assistant", answer)])


SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system"}


def parse_sharegpt(record: object, where: str) -> Record:
    record = _object(record, where, "'conversations' or 'messages'")
    if "conversations" in record:
        turns, role_key, text_key = record["conversations"], "from", "value"
    elif "messages" in record:
        turns, role_key, text_key = record["messages"], "role", "content"
    else:
        raise RecordError(f"{where}: expected a 'conversations' list of {{from, value}} or a 'messages' "
                          f"list of {{role, content}}", "missing 'conversations'")
    if not isinstance(turns, list) or not turns:
        field_name = "conversations" if role_key == "from" else "messages"
        raise RecordError(f"{where}: '{field_name}' must be a non-empty list", "empty conversation")
    messages: List[Message] = []
    for i, turn in enumerate(turns):
        turn = _object(turn, f"{where} turn {i + 1}", f"'{role_key}' and '{text_key}'")
        name = turn.get(role_key)
        if name not in SHAREGPT_ROLES:
            raise RecordError(f"{where} turn {i + 1}: unknown role {name!r}; expected one of "
                              f"{', '.join(SHAREGPT_ROLES)}", "unknown role")
        role = SHAREGPT_ROLES[name]
        # An empty user turn would train the model to answer nothing in particular.
        content = _string(turn, text_key, f"{where} turn {i + 1}", required=role != "system",
                          what=f"empty {role} turn" if role == "user" else "empty answer")
        if role == "system" and i != 0:
            raise RecordError(f"{where} turn {i + 1}: a system turn must come first", "misplaced system turn")
        messages.append((role, content))
    if messages[-1][0] != "assistant":
        raise RecordError(f"{where}: the conversation ends with a {messages[-1][0]} turn; expected it to "
                          f"end with the assistant", "no final assistant turn")
    return Record(where, messages=messages)


def parse_text(record: object, where: str) -> Record:
    record = _object(record, where, "'text'")
    return Record(where, text=_string(record, "text", where, required=True))


PARSERS = {"alpaca": parse_alpaca, "sharegpt": parse_sharegpt, "text": parse_text}
# The keys that give each format away, to say why a file read with the wrong --format fails.
FORMAT_KEYS = {"alpaca": ("instruction",), "sharegpt": ("conversations", "messages"), "text": ("text",)}


def _wrong_format(raw: object, fmt: str, error: RecordError) -> RecordError:
    """`error`, or, when the record carries another format's keys, an error saying so."""
    if not isinstance(raw, dict) or any(key in raw for key in FORMAT_KEYS[fmt]):
        return error
    for other, keys in FORMAT_KEYS.items():
        found = [key for key in keys if key in raw]
        if other != fmt and found:
            where = str(error).split(": ", 1)[0]
            return RecordError(f"{where}: read as {fmt}, but the record has '{found[0]}', a {other} field: "
                               f"pass --format {other} (data.format: {other} in a recipe)",
                               f"{other} record read as {fmt}")
    return error


def iter_records(paths, fmt: str) -> Iterator[Record | RecordError]:
    """Every record of every file, in order; a bad record is yielded as its RecordError.
    A missing, empty or undecodable file raises at once."""
    parse = PARSERS[fmt]
    for path in map(Path, paths):
        if not path.is_file():
            raise RecordError(f"{path}: file not found")
        count = 0
        for lineno, raw in _raw_records(path):
            count += 1
            if isinstance(raw, RecordError):
                yield raw
                continue
            try:
                yield parse(raw, f"{path}:{lineno}")
            except RecordError as exc:
                yield _wrong_format(raw, fmt, exc)
        if count == 0:
            raise RecordError(f"{path}: no records (empty input)")


def read_records(paths, fmt: str = "alpaca") -> List[Record]:
    """All records, stopping at the first bad one."""
    records = []
    for item in iter_records(paths, fmt):
        if isinstance(item, RecordError):
            raise item
        records.append(item)
    return records
