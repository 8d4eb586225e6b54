"""Malformed inputs, as a careless user or a broken disk hands them over, and what reading
each one must give: a clean refusal (the project's own error, one line, naming the file where
there is one, nothing on disk changed) or an acceptance. Anything else is a defect.

One kind an input type, each a hypothesis strategy of cases and the in-process function the
commands call on such an input (recipe loading and validation, the data readers, exam
layouts, Hugging Face directory inspection, checkpoint reading, argument parsing), below the
CLI so that no case imports MindSpore. tests/test_fuzz.py runs them in CI with a fixed seed;
scripts/fuzz.py runs many more and prints the table.
"""
from __future__ import annotations

import codecs
import csv
import io
import json
import os
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional

import yaml
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parent.parent
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))


class Defect(AssertionError):
    """A refusal that breaks the promise: more than one line, not naming the file, or
    changing what was on disk."""


# ---------------------------------------------------------------- values of any type

_ODD_TEXT = ["", " ", "null", "~", "auto", "nan", "NaN", "-inf", "1e400", "-0", "0x10", "1_000", "٣", "０",
             "true", "off", "29GB", "0GB", "static:0", "static:nan", "dynamic", "O2", "float16", "llama3.2-1b",
             "910a", "cpu", "\x00", "\u2028", "a" * 300, "é", "中文", "🦙", "{a: b}", "[1, 2]", "'", '"', "- x",
             ".*wq", "[", "*"]
# Line and paragraph separators, NEL and controls: str.splitlines() splits on them, a JSON
# line or a CSV cell need not.
ODD_CHARS = "\u2028\u2029\x85\x1c\x1d\x1e\x0b\x0c\r\t \u00a0\u3000\ufeff\"',;=:#[]{}\\中文é🦙"
text = st.text(alphabet=st.one_of(st.characters(blacklist_categories=("Cs",)), st.sampled_from(ODD_CHARS)),
               max_size=24)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.sampled_from([0, -1, 1, 2**31, 2**63, 2**64, -2**63]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(_ODD_TEXT), text)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(st.one_of(text, st.integers()), inner,
                                                                        max_size=3)),
                      max_leaves=8)


# ---------------------------------------------------------------- file damage

@st.composite
def damaged(draw, data: bytes) -> bytes:
    """`data` as a broken disk or a cut-off copy leaves it: truncated, a byte flipped, bytes
    inserted or removed; or whole."""
    how = draw(st.sampled_from(["whole", "whole", "truncate", "flip", "insert", "delete", "empty"]))
    if how == "whole" or not data:
        return data
    if how == "empty":
        return b""
    at = draw(st.integers(0, len(data) - 1))
    if how == "truncate":
        return data[:at]
    if how == "flip":
        return data[:at] + bytes([data[at] ^ (1 << draw(st.integers(0, 7)))]) + data[at + 1:]
    if how == "insert":
        return data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
    return data[:at] + data[at + draw(st.integers(1, 8)):]


# ---------------------------------------------------------------- recipes

def _paths(tree, prefix=()) -> list:
    """Every key path of a nested mapping, sections and leaves."""
    found = []
    if isinstance(tree, dict):
        for key, value in tree.items():
            found.append(prefix + (key,))
            found += _paths(value, prefix + (key,))
    return found


def _schema_paths() -> list:
    import dataclasses
    import typing

    from llama_npu.recipe.schema import Recipe

    def walk(cls, prefix):
        out = []
        for name, tp in typing.get_type_hints(cls).items():
            out.append(prefix + (name,))
            if dataclasses.is_dataclass(tp):
                out += walk(tp, prefix + (name,))
        return out
    return walk(Recipe, ())


SCHEMA_PATHS = _schema_paths()

# YAML a hand or an editor writes wrong: a key with no value (null), tabs, aliases, tags,
# documents, deep nesting.
YAML_SLIPS = ["{key}:\n", "{key}: \n", "{key}: ~\n", "\t{key}: 1\n", "{key}: &a [*a]\n", "{key}: !!binary aGk=\n",
              "{key}: !!python/name:os.system\n", "---\n---\n", "{key}: " + "[" * 200 + "]" * 200 + "\n",
              "{key}: " + "{{a: " * 60 + "1" + "}}" * 60 + "\n", "? [a, b]\n: 1\n", "{key}: 1\n{key}: 2\n",
              "{key}: |\n  x\n y\n", "%YAML 9.9\n---\n", "{key}: 1e9999\n", "{key}: .nan\n", "{key}: -.inf\n",
              "{key}: 0o777\n", "{key}: 2026-12-03\n", "{key}: :\n", "- {key}\n"]


def _set_in(tree: dict, path: tuple, value) -> None:
    node = tree
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value


@st.composite
def recipe_texts(draw) -> str:
    """A shipped recipe with some keys (leaves or whole sections) set to any value, removed
    or added, then possibly a YAML slip or byte damage in its text."""
    source = draw(st.sampled_from(RECIPES))
    tree = yaml.safe_load(source.read_text(encoding="utf-8"))
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(_paths(tree) + SCHEMA_PATHS))
        action = draw(st.sampled_from(["value", "value", "value", "null", "delete", "unknown"]))
        if action == "delete":
            node = tree
            for key in path[:-1]:
                node = node.get(key) if isinstance(node, dict) else None
            if isinstance(node, dict):
                node.pop(path[-1], None)
        elif action == "unknown":
            _set_in(tree, path[:-1] + (draw(text),), draw(values))
        else:
            _set_in(tree, path, None if action == "null" else draw(values))
    written = yaml.safe_dump(tree, allow_unicode=True, sort_keys=False)
    if draw(st.booleans()):
        key = ".".join(map(str, draw(st.sampled_from(SCHEMA_PATHS)))).split(".")
        slip = draw(st.sampled_from(YAML_SLIPS)).format(key=key[-1])
        if len(key) > 1:
            slip = "\n".join(f"{key[0]}:\n  " + line for line in slip.splitlines() if line) + "\n"
        at = draw(st.sampled_from([0, len(written)]))
        written = written[:at] + slip + written[at:]
    return draw(damaged(written.encode("utf-8")))


def lay_out_recipe(case: bytes, work: Path) -> None:
    (work / "recipe.yaml").write_bytes(case)


def read_recipe(case: bytes, work: Path) -> None:
    from llama_npu.recipe.load import load_recipe

    load_recipe(work / "recipe.yaml")


# ---------------------------------------------------------------- --set

@st.composite
def set_strings(draw) -> List[str]:
    """--set assignments: known keys (and sections, and unknown ones) set to any text."""
    def one():
        key = ".".join(map(str, draw(st.sampled_from(SCHEMA_PATHS))))
        key = draw(st.sampled_from([key, key, key + "." + draw(text), draw(text), key.upper(), f" {key} ",
                                    key.replace(".", "..")]))
        value = draw(st.one_of(text, st.sampled_from(_ODD_TEXT), values.map(lambda v: json.dumps(v))))
        return draw(st.sampled_from([f"{key}={value}", f"{key}={value}", key, f"={value}", f"{key}=={value}"]))
    return [one() for _ in range(draw(st.integers(1, 3)))]


def read_set(case: List[str], work: Path) -> None:
    from llama_npu.recipe.load import load_recipe

    load_recipe(REPO / "recipes" / "cpu_smoke.yaml", case)


# ---------------------------------------------------------------- data records

# A value a record requires: not blank, in any container (a workbook drops control characters).
words = text.filter(lambda s: any(c.isalnum() for c in s))


@st.composite
def clean_records(draw, fmt: str, pairs: bool) -> dict:
    """A record the readers must accept, in `fmt` (a preference pair with `pairs`)."""
    if fmt == "text":
        return {"text": draw(words)}
    if fmt == "alpaca":
        record = {"instruction": draw(words)}
        for key in ("input", "system"):
            if draw(st.booleans()):
                record[key] = draw(text)
    else:
        chat = draw(st.sampled_from([("conversations", "from", "value", "human", "gpt"),
                                     ("messages", "role", "content", "user", "assistant")]))
        key, role, content, user, assistant = chat
        turns = [{role: "system", content: draw(text)}] if draw(st.booleans()) else []
        for i in range(draw(st.integers(1, 3))):
            turns.append({role: user, content: draw(words)})
            if i or not pairs:
                turns.append({role: assistant, content: draw(words)})
        if pairs and turns[-1][role] == assistant:
            turns.append({role: user, content: draw(words)})
        record = {key: turns}
    if pairs:
        chosen = draw(words)
        record.update(chosen=chosen, rejected=draw(words.filter(lambda s: s.strip() != chosen.strip())))
    else:
        record.setdefault("output", draw(words)) if fmt == "alpaca" else None
    return record


CONTAINERS = ("jsonl", "json", "csv", "tsv", "xlsx", "parquet")
SUFFIX = {"jsonl": ".jsonl", "json": ".json", "csv": ".csv", "tsv": ".tsv", "xlsx": ".xlsx", "parquet": ".parquet"}


@dataclass
class RecordCase:
    fmt: str  # alpaca | sharegpt | text
    pairs: bool  # preference pairs (train.objective: dpo)
    container: str
    data: bytes  # the file
    columns: dict  # data.columns
    encoding: str  # data.encoding
    on_bad_record: str
    clean: Optional[list]  # when every record is valid and the file intact: the records as meant

    def __repr__(self):
        return (f"RecordCase({self.fmt}{' pairs' if self.pairs else ''}, {self.container}, columns={self.columns}, "
                f"encoding={self.encoding!r}, on_bad_record={self.on_bad_record}, clean={self.clean is not None}, "
                f"data={self.data[:600]!r})")


def _cell(value) -> object:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False) if isinstance(value, (list, dict)) else str(value)


def _table(records: list) -> tuple:
    header = list(dict.fromkeys(key for r in records if isinstance(r, dict) for key in r))
    rows = [[_cell(r.get(k)) if isinstance(r, dict) else _cell(r) for k in header] for r in records]
    return [str(h) for h in header], rows


def _xlsx_safe(value):
    """Text as a workbook can hold it (Excel stores no control characters)."""
    from openpyxl.cell.cell import ILLEGAL_CHARACTERS_RE

    if isinstance(value, str):
        return ILLEGAL_CHARACTERS_RE.sub("", value)
    if isinstance(value, list):
        return [_xlsx_safe(v) for v in value]
    if isinstance(value, dict):
        return {_xlsx_safe(k): _xlsx_safe(v) for k, v in value.items()}
    return value


def _serialized(container: str, records: list, draw) -> str | bytes:
    if container == "jsonl":
        blank = draw(st.sampled_from(["", "\n", "  \n"]))
        return blank.join(json.dumps(r, ensure_ascii=draw(st.booleans())) + "\n" for r in records)
    if container == "json":
        return json.dumps(records, ensure_ascii=draw(st.booleans()), indent=draw(st.sampled_from([None, 1, "\t"])))
    header, rows = _table(records)
    if container in ("csv", "tsv"):
        out = io.StringIO()
        writer = csv.writer(out, delimiter="," if container == "csv" else "\t",
                            lineterminator=draw(st.sampled_from(["\r\n", "\n"])))
        writer.writerows([header, *rows])
        return out.getvalue()
    if container == "xlsx":
        from openpyxl import Workbook

        book = Workbook()
        sheet = book.active
        for r, row in enumerate([header, *rows], start=1):
            for c, value in enumerate(row, start=1):
                cell = sheet.cell(r, c, value)
                if isinstance(value, str) and value.startswith("="):
                    cell.data_type = "s"  # text, as Excel keeps a typed "=x"; openpyxl would make it a formula
        out = io.BytesIO()
        book.save(out)
        return out.getvalue()
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = io.BytesIO()
    columns = {name: [row[i] for row in rows] for i, name in enumerate(header)}
    pq.write_table(pa.table(columns if columns else {"empty": pa.array([], pa.string())}), out)
    return out.getvalue()


@st.composite
def record_cases(draw) -> RecordCase:
    """Records of one format in one file: valid ones, mutated ones (a key set to any value,
    removed, or the record replaced), in any container and encoding, under a column map,
    the file possibly damaged."""
    fmt = draw(st.sampled_from(["alpaca", "sharegpt", "text"]))
    pairs = fmt != "text" and draw(st.booleans())
    container = draw(st.sampled_from(CONTAINERS))
    records, clean = [], True
    for _ in range(draw(st.integers(0, 4))):
        record = draw(clean_records(fmt, pairs))
        how = draw(st.sampled_from(["clean", "clean", "extra", "value", "delete", "replace", "turn"]))
        if how == "extra":  # a column the format does not read: the same record
            record[draw(st.sampled_from(["id", "source", "备注", "score"]))] = draw(values)
        elif how == "value":
            record[draw(st.sampled_from(sorted(record)))] = draw(values)
        elif how == "delete":
            record.pop(draw(st.sampled_from(sorted(record))))
        elif how == "replace":
            record = draw(values)
        elif how == "turn" and fmt == "sharegpt":
            turns = next(iter(v for k, v in record.items() if k in ("conversations", "messages")))
            at = draw(st.integers(0, len(turns) - 1))
            turns[at] = draw(st.one_of(values, st.fixed_dictionaries({draw(st.sampled_from(sorted(turns[at]))):
                                                                          values})))
        clean = clean and how in ("clean", "extra")
        records.append(record)
    clean = clean and bool(records)
    if container == "xlsx":
        records = _xlsx_safe(records)
    meant = json.loads(json.dumps(records))  # before the column map renames keys
    columns = {}
    if draw(st.booleans()) and records and isinstance(records[0], dict):
        for key in draw(st.lists(st.sampled_from([k for k in records[0] if isinstance(k, str)] or [""]), max_size=2, unique=True)):
            column = draw(st.sampled_from(["指令", "输出", "Prompt", "col 1", draw(words).strip()]))
            column = _xlsx_safe(column).strip() if container == "xlsx" else column
            if not column or column in records[0] or column in columns.values():
                continue
            columns[key] = column
            for r in records:
                if isinstance(r, dict) and key in r:
                    r[column] = r.pop(key)
    body = _serialized(container, records, draw)
    encoding = ""
    if isinstance(body, str):
        codec = draw(st.sampled_from(["utf-8", "utf-8", "utf-8-sig", "utf-16", "gbk", "gbk-unnamed", "latin-1"]))
        try:
            body = body.encode(codec.replace("-unnamed", ""))
            encoding = codec if codec in ("gbk", "latin-1") else ""
            if codec == "gbk-unnamed":
                clean = clean and body.isascii()
        except UnicodeEncodeError:
            body = body.encode("utf-8")
    data = draw(damaged(body))
    clean = clean and data == body
    return RecordCase(fmt, pairs, container, data, columns, encoding, draw(st.sampled_from(["error", "skip"])),
                      meant if clean else None)


def _read(case: RecordCase, path: Path):
    from llama_npu.data.pairs import read_pairs
    from llama_npu.data.readers import read_dataset
    from llama_npu.data.tables import ReadOptions

    options = ReadOptions.of(case.columns, case.encoding)
    read = read_pairs if case.pairs else read_dataset
    return read([path], case.fmt, case.on_bad_record, options)[0]


def _tokens(case: RecordCase, records: list) -> list:
    """What the records train into: token ids and labels (SFT), or each pair's turns."""
    if case.pairs:
        return [(r.prompt, r.chosen, r.rejected) for r in records]
    from llama_npu.data.samples import tokenize_records
    from llama_npu.data.tokenizer import load_tokenizer

    import contextlib

    with contextlib.redirect_stderr(io.StringIO()):  # its progress bar
        samples, _ = tokenize_records(load_tokenizer(), records, 4096)
    return [(s.input_ids, s.labels) for s in samples]


def lay_out_records(case: RecordCase, work: Path) -> None:
    (work / f"train{SUFFIX[case.container]}").write_bytes(case.data)
    if case.clean is not None:
        (work / "clean.jsonl").write_text("".join(json.dumps(r) + "\n" for r in case.clean), encoding="utf-8")


def read_records(case: RecordCase, work: Path) -> None:
    from llama_npu.data.readers import RecordError, detect_format
    from llama_npu.data.tables import ReadOptions

    path = work / f"train{SUFFIX[case.container]}"
    try:  # eval --data and plan --write-recipe take the format from the first record
        detect_format(path, ReadOptions.of(case.columns, case.encoding))
    except RecordError as exc:
        check_refusal(exc, [path])
    try:
        records = _read(case, path)
    except RecordError as exc:
        if case.clean is not None:
            raise Defect(f"a valid file refused: {exc}") from None
        raise
    if case.clean is not None:
        canonical = work / "clean.jsonl"
        plain = RecordCase(case.fmt, case.pairs, "jsonl", b"", {}, "", "error", None)
        if _tokens(case, records) != _tokens(case, _read(plain, canonical)):
            raise Defect(f"{path}: accepted, but its records train into other tokens than their clean form")


# ---------------------------------------------------------------- exam layouts

EXAM_SAMPLES = {"ceval": REPO / "data" / "ceval_sample", "cmmlu": REPO / "data" / "cmmlu_sample",
                "mmlu": REPO / "data" / "mmlu_sample"}


@dataclass
class ExamCase:
    task: str
    split: Optional[str]
    subjects: Optional[List[str]]
    shots: int
    files: dict  # relative path -> bytes (None: a directory)

    def __repr__(self):
        shown = {k: (v[:300] if v else v) for k, v in self.files.items()}
        return f"ExamCase({self.task}, split={self.split}, subjects={self.subjects}, shots={self.shots}, {shown})"


@st.composite
def exam_cases(draw) -> ExamCase:
    """A shipped exam sample (C-Eval, CMMLU or MMLU) with files removed, renamed, rows and
    cells set to anything, headers changed, re-encoded or damaged; read as any task."""
    sample = draw(st.sampled_from(sorted(EXAM_SAMPLES)))
    files = {str(p.relative_to(EXAM_SAMPLES[sample])): p.read_bytes()
             for p in sorted(EXAM_SAMPLES[sample].rglob("*.csv"))}
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(sorted(files)))
        how = draw(st.sampled_from(["cell", "cell", "row", "header", "encode", "damage", "remove", "rename", "dir"]))
        try:
            rows = list(csv.reader(files[name].decode("utf-8", "replace").splitlines())) if files[name] else []
        except csv.Error:  # a cell past the field limit, from an earlier mutation
            rows = []
        if how == "remove":
            del files[name]
            if not files:
                break
            continue
        if how == "rename":
            files[str(Path(name).parent / (draw(text) + ".csv"))] = files.pop(name)
            continue
        if how == "dir":
            files[str(Path(name).parent / draw(st.sampled_from(["sub.csv", "x"])))] = None
            continue
        if how == "cell" and rows:
            row = draw(st.sampled_from(rows))
            value = draw(st.one_of(text, st.sampled_from(["", "A", " B ", "E", "a", "AB", "1", "\x00", "x" * 140000])))
            if row:
                row[draw(st.integers(0, len(row) - 1))] = value
            else:
                row.append(value)
        elif how == "row" and rows:
            rows.insert(draw(st.integers(0, len(rows))), draw(st.lists(text, max_size=9)))
        elif how == "header" and rows:
            rows[0] = draw(st.lists(st.sampled_from(["id", "question", "Question", "A", "B", "C", "D", "answer",
                                                     "Answer", "", "explanation"]), max_size=8))
        out = io.StringIO()
        csv.writer(out, lineterminator=draw(st.sampled_from(["\n", "\r\n", "\r"]))).writerows(rows)
        body = out.getvalue()
        if how == "encode":
            codec = draw(st.sampled_from(["gbk", "utf-16", "utf-8-sig", "latin-1"]))
            files[name] = body.encode(codec, "replace")
        elif how == "damage":
            files[name] = draw(damaged(body.encode("utf-8")))
        else:
            files[name] = body.encode("utf-8")
    task = draw(st.sampled_from([sample, sample, sample, "ceval", "cmmlu", "mmlu"]))
    subjects = sorted({Path(n).name.rsplit(".", 1)[0].replace("_dev", "").replace("_val", "").replace("_test", "")
                       for n in files})
    chosen = draw(st.one_of(st.none(), st.lists(st.sampled_from(subjects + ["", "history", "../x"]), min_size=1,
                                                max_size=2)))
    split = draw(st.sampled_from([None, None, "dev", "val", "test", "train", "", "../dev"]))
    return ExamCase(task, split, chosen, draw(st.sampled_from([0, 0, 1, 5])), files)


def lay_out_exam(case: ExamCase, work: Path) -> None:
    root = work / "exam"
    root.mkdir()
    for name, body in case.files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if body is None:
            path.mkdir(exist_ok=True)
        elif not path.is_dir():
            path.write_bytes(body)


def read_exam(case: ExamCase, work: Path) -> None:
    from llama_npu.evaluation.exams.layouts import read_exam as read

    read(case.task, work / "exam", case.split, case.subjects, case.shots)


# ---------------------------------------------------------------- command-line flags

def _parser():
    from llama_npu.cli import build_parser

    return build_parser()


@st.composite
def flag_lists(draw) -> List[str]:
    """A sub-command with any of its options (and some it lacks), each with any value."""
    import argparse

    parser = _parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    command = draw(st.sampled_from(sorted(commands)))
    options = [s for a in commands[command]._actions for s in a.option_strings if s not in ("-h", "--help")]
    argv = [command]
    for _ in range(draw(st.integers(0, 5))):
        flag = draw(st.sampled_from(options + ["--no-such-flag", "-x", "--"] if options else ["--x"]))
        argv.append(flag)
        for _ in range(draw(st.integers(0, 2))):
            argv.append(draw(st.one_of(st.sampled_from(_ODD_TEXT), text, st.integers(-5, 10**20).map(str))))
    return argv


def parse_flags(case: List[str], work: Path) -> None:
    import contextlib

    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        _parser().parse_args(case)


# ---------------------------------------------------------------- the kinds and what counts

def nothing(case, work: Path) -> None:
    """The case is no file."""


@dataclass
class Kind:
    cases: Callable  # () -> a hypothesis strategy of cases
    lay_out: Callable  # (case, work dir): the case's files
    read: Callable  # (case, work dir) -> None, as a command reads it; raises the project's own error to refuse


KINDS = {
    "recipes": Kind(recipe_texts, lay_out_recipe, read_recipe),
    "set": Kind(set_strings, nothing, read_set),
    "records": Kind(record_cases, lay_out_records, read_records),
    "exams": Kind(exam_cases, lay_out_exam, read_exam),
    "flags": Kind(flag_lists, nothing, parse_flags),
}


class UsageError(Exception):
    """argparse's own exit 2 with its usage line (parse_args raising SystemExit)."""


def user_errors() -> tuple:
    from llama_npu.cli import user_errors as project_errors

    return (*project_errors(), UsageError)


def snapshot(root: Path) -> dict:
    """Every file and directory under `root` with its bytes, to see a refusal changed nothing."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def check_refusal(exc: BaseException, files: list) -> None:
    """A refusal is one line, and names the file when one is at fault."""
    message = str(exc)
    if not message.strip() or "\n" in message or "\r" in message:
        raise Defect(f"refusal is not one line: {message!r}")


def attempt(kind: str, case, work: Path) -> str:
    """'accepted' or 'refused'; a Defect when the refusal breaks a promise; any other
    exception is a traceback the user would have seen."""
    KINDS[kind].lay_out(case, work)
    before = snapshot(work)
    try:
        try:
            KINDS[kind].read(case, work)
        except SystemExit as exc:
            if exc.code not in (0, 2):
                raise
            if exc.code == 2:
                raise UsageError() from None
        return "accepted"
    except user_errors() as exc:
        if not isinstance(exc, UsageError):
            check_refusal(exc, [])
        if snapshot(work) != before:
            raise Defect(f"a refusal changed files under {work}") from None
        return "refused"
