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
    inserted or removed; or whole. Or as a hostile hand writes it: nested thousands deep."""
    how = draw(st.sampled_from(["whole", "whole", "truncate", "flip", "insert", "delete", "empty", "deep"]))
    if how == "whole" or not data:
        return data
    if how == "empty":
        return b""
    if how == "deep":
        return draw(st.sampled_from([b"[", b"{\"a\": ", b"- "])) * 20000 + data
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


_WORKBOOKS: dict = {}


def _workbook(header: list, rows: list) -> bytes:
    """The rows as an .xlsx, the same bytes each time for the same rows: hypothesis replays a
    case and needs the same bytes, and openpyxl stamps the time of saving into the zip."""
    key = json.dumps([header, rows])
    if key not in _WORKBOOKS:
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
        _WORKBOOKS[key] = out.getvalue()
    return _WORKBOOKS[key]


def _serialized(container: str, records: list, draw) -> str | bytes:
    if container == "jsonl":
        blank = draw(st.sampled_from(["", "\n", "  \n"]))
        return blank.join(json.dumps(r, ensure_ascii=draw(st.booleans())) + "\n" for r in records)
    if container == "json":
        return json.dumps(records, ensure_ascii=draw(st.booleans()), indent=draw(st.sampled_from([None, 1, "\t"])))
    header, rows = _table(records)
    if container in ("csv", "tsv"):
        out = io.StringIO()
        # "\r\n": with "\n" alone the csv module leaves a cell's lone "\r" unquoted, a file no
        # reader (nor Excel) reads back as written
        writer = csv.writer(out, delimiter="," if container == "csv" else "\t", lineterminator="\r\n",
                            quoting=draw(st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL])))
        writer.writerows([header, *rows])
        return out.getvalue()
    if container == "xlsx":
        return _workbook(header, rows)
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
        keys = [k for k in records[0] if isinstance(k, str)] or [""]
        for key in draw(st.lists(st.sampled_from(keys), max_size=2, unique=True)):
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
    from llama_npu.objectives.dpo.records import read_pairs
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


def _write_tree(root: Path, files: dict) -> None:
    """relative path -> bytes (None: a directory) under `root`; a generated name that would
    leave it ("..", "/x") or that no file system takes (NUL, too long) is left out."""
    root.mkdir(parents=True, exist_ok=True)
    for name, body in files.items():
        path = root / name
        if "\x00" in name or root.resolve() not in path.resolve().parents:
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if body is None:
                path.mkdir(exist_ok=True)
            elif not path.is_dir():
                path.write_bytes(body)
        except OSError:  # a file where a directory goes, a name too long
            continue


def lay_out_exam(case: ExamCase, work: Path) -> None:
    _write_tree(work / "exam", case.files)


def read_exam(case: ExamCase, work: Path) -> None:
    from llama_npu.evaluation.exams.layouts import read_exam as read

    read(case.task, work / "exam", case.split, case.subjects, case.shots)


# ---------------------------------------------------------------- Hugging Face directories

# Llama 3.2's layout at the smallest size its checks take (the vocabulary is the real one):
# a 2 MB bfloat16 model, so that a case converts in milliseconds.
TINY = dict(hidden_size=8, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=16, vocab_size=128256)
_BUILT: dict = {}


def _safetensors(header: dict, data: bytes, length: Optional[int] = None) -> bytes:
    encoded = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(encoded) if length is None else length) + encoded + data


def tiny_hf_files() -> dict:
    """name -> bytes of a valid Hugging Face directory of the TINY shape (built once)."""
    if "hf" not in _BUILT:
        import numpy as np

        from llama_npu.model.architecture import LlamaShape
        from llama_npu.weights.convert import hf_config
        from llama_npu.weights.tensor_files import expected_shapes

        shape = LlamaShape(**TINY)
        header, blobs, offset = {}, [], 0
        rng = np.random.default_rng(0)
        for name, dims in expected_shapes(shape).items():
            blob = rng.standard_normal(dims, dtype=np.float32).astype(np.float16).tobytes()  # F16: numpy has it
            header[name] = {"dtype": "F16", "shape": list(dims), "data_offsets": [offset, offset + len(blob)]}
            blobs.append(blob)
            offset += len(blob)
        _BUILT["hf"] = {"config.json": json.dumps(hf_config(shape, "float16"), indent=2).encode(),
                        "model.safetensors": _safetensors(header, b"".join(blobs)),
                        "tokenizer_config.json": b'{"bos_token": "<|begin_of_text|>"}'}
    return dict(_BUILT["hf"])


def _split_header(data: bytes) -> tuple:
    """(header, data) of a safetensors file; ({}, data) when an earlier mutation broke it."""
    try:
        (length,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + length])
    except (struct.error, ValueError, RecursionError):
        return {}, data
    return (header if isinstance(header, dict) else {}), data[8 + length:]


def _json(data: Optional[bytes]):
    try:
        return json.loads(data or b"")
    except (ValueError, RecursionError):
        return None


@st.composite
def hf_cases(draw) -> dict:
    """A Hugging Face directory (name -> bytes; None: a directory in the file's place) with its
    config.json values set to anything, its safetensors header lying (dtype, shape, offsets,
    length), shards and their index, a tokenizer.json of another vocabulary, files damaged
    or missing."""
    files = tiny_hf_files()
    for _ in range(draw(st.integers(0, 3))):
        how = draw(st.sampled_from(["config", "config", "header", "header", "length", "shards", "tokenizer",
                                    "damage", "remove", "dir"]))
        config = _json(files.get("config.json"))
        if how == "config" and isinstance(config, dict):
            key = draw(st.sampled_from(sorted(config) + ["rope_scaling", "num_key_value_heads", "extra"]))
            config[key] = draw(st.one_of(values, st.sampled_from([0, -1, 2**40, 2**63, 3, 4096, 128257, 1.5, True,
                                                                  "8", None, {"rope_type": "llama3"}])))
            files["config.json"] = json.dumps(config).encode()
        elif how == "header" and files.get("model.safetensors"):
            header, data = _split_header(files["model.safetensors"])
            name = draw(st.sampled_from(sorted(header) or ["x"]))
            what = draw(st.sampled_from(["dtype", "shape", "data_offsets", "entry", "remove", "rename"]))
            if not isinstance(header.get(name), dict):
                header[name] = draw(values)
            elif what == "remove":
                del header[name]
            elif what == "rename":
                header[draw(text)] = header.pop(name)
            elif what == "entry":
                header[name] = draw(values)
            else:
                header[name][what] = draw(st.one_of(values, st.sampled_from(
                    ["F32", "BF16", "I8", "F64", "U8", "BOOL", [2**40, 2**40], [8, 2**62], [0, 2**63], [-1, 5],
                     [5, 1], [0], [], [128256, 8, 1]])))
            files["model.safetensors"] = _safetensors(header, data)
        elif how == "length" and files.get("model.safetensors"):
            header, data = _split_header(files["model.safetensors"])
            files["model.safetensors"] = _safetensors(header, data, draw(st.sampled_from(
                [0, 1, 7, 2**31, 2**40, 2**64 - 1, len(json.dumps(header)) + 1])))
        elif how == "shards" and files.get("model.safetensors"):
            header, data = _split_header(files.pop("model.safetensors"))
            names = sorted(n for n in header if isinstance(header[n], dict) and "data_offsets" in header[n])
            cut = draw(st.integers(0, len(names)))
            shard_map = {}
            for shard, part in (("model-00001-of-00002.safetensors", names[:cut]),
                                ("model-00002-of-00002.safetensors", names[cut:])):
                sub, blobs, offset = {}, [], 0
                for n in part:
                    offsets = header[n]["data_offsets"]
                    fits = isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
                    blob = data[offsets[0]:offsets[1]] if fits else b""
                    sub[n] = dict(header[n], data_offsets=[offset, offset + len(blob)])
                    blobs.append(blob)
                    offset += len(blob)
                    shard_map[n] = shard
                files[shard] = _safetensors(sub, b"".join(blobs))
            if draw(st.booleans()):
                shard_map[draw(st.sampled_from(names or ["x"]))] = draw(st.sampled_from(
                    ["model-00003-of-00002.safetensors", "../config.json", "", "/etc/passwd"]))
            index = {"metadata": {}, "weight_map": shard_map}
            if draw(st.booleans()):
                index = draw(st.sampled_from([{"weight_map": draw(values)}, draw(values), {"metadata": {}}]))
            files["model.safetensors.index.json"] = json.dumps(index).encode()
        elif how == "tokenizer":
            files["tokenizer.json"] = draw(st.one_of(
                st.binary(max_size=64), values.map(lambda v: json.dumps(v).encode()),
                st.dictionaries(text, st.integers(-1, 200000), max_size=4).map(
                    lambda vocab: json.dumps({"model": {"vocab": vocab}}).encode())))
        elif how == "damage":
            name = draw(st.sampled_from(sorted(n for n in files if files[n] is not None) or ["config.json"]))
            files[name] = draw(damaged(files.get(name) or b""))
        elif how == "remove" and files:
            files.pop(draw(st.sampled_from(sorted(files))))
        elif how == "dir":
            files[draw(st.sampled_from(["config.json", "model.safetensors", "tokenizer.json"]))] = None
    return files


def lay_out_hf(case: dict, work: Path) -> None:
    _write_tree(work / "hf", case)


def _quiet(call, *args):
    """`call(*args)` with its progress lines and bars kept off the console."""
    import contextlib

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return call(*args)


def convert_hf(case: dict, work: Path) -> None:
    """What `convert hf-to-ms` does (numpy only): the headers checked, then every tensor
    streamed into model.ckpt."""
    from llama_npu.weights.convert import hf_to_ms

    _quiet(hf_to_ms, work / "hf", work / "converted", "float16")


# ---------------------------------------------------------------- checkpoint directories

def tiny_run_files() -> dict:
    """relative path -> bytes of a finished run of the TINY shape: its recipe, two complete
    steps (model.ckpt, optimizer.ckpt, config.json, state.json, checksums.json, as
    checkpoints/files.save_checkpoint writes them), built once without MindSpore."""
    if "run" not in _BUILT:
        import tempfile

        import numpy as np

        from llama_npu.common.checksums import file_crc32, write_manifest
        from llama_npu.weights.convert import hf_to_ms
        from llama_npu.weights.tensor_files import CkptWriter

        files = {"recipe.yaml": (REPO / "recipes" / "cpu_smoke.yaml").read_bytes()}
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            _write_tree(tmp / "hf", tiny_hf_files())
            _quiet(hf_to_ms, tmp / "hf", tmp / "converted", "float16")
            writer = CkptWriter(tmp / "optimizer.ckpt")
            writer.write("adam_m.model.tok_embeddings.embedding_weight", "F32", (4,), [np.ones(4, np.float32)])
            writer.close()
            for step in (3, 6):
                directory = tmp / "run" / "checkpoints" / f"step_{step}"
                directory.mkdir(parents=True)
                for name, source in (("model.ckpt", tmp / "converted" / "model.ckpt"),
                                     ("config.json", tmp / "converted" / "config.json"),
                                     ("optimizer.ckpt", tmp / "optimizer.ckpt")):
                    (directory / name).write_bytes(source.read_bytes())
                names = ("model.ckpt", "optimizer.ckpt")
                state = {"step": step, "samples_consumed": step * 8, "loss_scale": {"scale": 1.0, "clean_steps": 0},
                         "recipe_hash": "0" * 16, "files": {n: (directory / n).stat().st_size for n in names},
                         "crc32": {n: file_crc32(directory / n) for n in names}}
                (directory / "state.json").write_text(json.dumps(state, indent=2), encoding="utf-8")
                write_manifest(directory, f"llama-npu train (step {step})")
            for path in sorted((tmp / "run").rglob("*")):
                if path.is_file():
                    files[str(path.relative_to(tmp / "run"))] = path.read_bytes()
        _BUILT["run"] = files
    return dict(_BUILT["run"])


DEAD_PID = 2**22 + 1  # above Linux's largest pid_max: never a live process


@st.composite
def checkpoint_cases(draw) -> dict:
    """A run directory (relative path -> bytes) whose steps are damaged in every way that
    matters: a file truncated, a byte flipped, a file missing, state.json's values set to
    anything (with checksums.json sealed over the lie, or not, or gone), leftovers of killed
    saves (.step_N.partial-PID, .step_N.old-PID, of dead or live processes)."""
    files = tiny_run_files()
    steps = ("checkpoints/step_3", "checkpoints/step_6")
    for _ in range(draw(st.integers(0, 3))):
        how = draw(st.sampled_from(["damage", "damage", "state", "state", "remove", "leftover", "recipe",
                                    "unsealed"]))
        step = draw(st.sampled_from(steps))
        if how == "damage":
            name = draw(st.sampled_from(sorted(n for n in files if n.startswith(step)) or ["recipe.yaml"]))
            files[name] = draw(damaged(files.get(name) or b""))
        elif how == "state" and f"{step}/state.json" in files:
            state = _json(files[f"{step}/state.json"])
            if isinstance(state, dict):
                key = draw(st.sampled_from(sorted(state) + ["step", "files", "crc32"]))
                if draw(st.booleans()):
                    state[key] = draw(st.one_of(values, st.sampled_from([0, -1, 2**63, 9, "6", None, {}])))
                elif isinstance(state.get(key), dict) and state[key]:
                    state[key][draw(st.sampled_from(sorted(state[key])))] = draw(values)
                else:
                    state.pop(key, None)
            files[f"{step}/state.json"] = json.dumps(state).encode()
            if draw(st.booleans()):  # sealed over the lie: the manifest agrees, the sidecar's values do not
                files[f"{step}/checksums.json"] = _resealed(files, step)
        elif how == "remove":
            name = draw(st.sampled_from(sorted(n for n in files if n.startswith(step)) or ["recipe.yaml"]))
            files.pop(name, None)
        elif how == "unsealed":
            files.pop(f"{step}/checksums.json", None)  # a step written by an older llama-npu
        elif how == "leftover":
            kind = draw(st.sampled_from(["partial", "old"]))
            pid = draw(st.sampled_from([DEAD_PID, os.getppid(), 1]))
            number = draw(st.sampled_from([3, 6, 9]))
            for name in [n for n in files if n.startswith(f"{draw(st.sampled_from(steps))}/")]:
                if draw(st.integers(0, 3)):  # some of its files: a save cut off
                    files[f"checkpoints/.step_{number}.{kind}-{pid}/{name.rsplit('/', 1)[1]}"] = files[name]
        elif how == "recipe":
            files["recipe.yaml"] = draw(st.one_of(recipe_texts(), st.binary(max_size=40)))
    return files


def _resealed(files: dict, step: str) -> bytes:
    import tempfile

    from llama_npu.common.checksums import write_manifest

    with tempfile.TemporaryDirectory() as tmp:
        for name, body in files.items():
            if name.startswith(f"{step}/") and body is not None and not name.endswith("checksums.json"):
                (Path(tmp) / name.rsplit("/", 1)[1]).write_bytes(body)
        write_manifest(Path(tmp), "llama-npu train")
        return (Path(tmp) / "checksums.json").read_bytes()


def lay_out_run(case: dict, work: Path) -> None:
    _write_tree(work / "run", case)


def repair(case: dict, work: Path) -> None:
    """What `train` does first in a run directory: clear what killed saves left (a refusal
    here, of a save still under way, must change nothing either)."""
    from llama_npu.checkpoints.leftovers import repair_killed_saves

    _quiet(repair_killed_saves, work / "run")


def resume_and_export(case: dict, work: Path) -> None:
    """What `train --resume auto` does next, before MindSpore (the complete steps, the step
    every rank can resume, its sidecar's values), then what `eval`, `generate` and `convert
    ms-to-hf` read (the run's newest good step, verified, its tensors streamed out)."""
    from llama_npu.checkpoints.files import inspect
    from llama_npu.checkpoints.policy import Checkpointer
    from llama_npu.strategies.parallel import World
    from llama_npu.training.preflight import check_rewind, resume_candidates
    from llama_npu.weights.convert import ms_to_hf

    run = work / "run"
    candidates = _quiet(resume_candidates, run, "auto")
    check_rewind(run, candidates)
    chosen = _quiet(Checkpointer(run, World(), keep_last=2).choose, candidates)
    if chosen is not None:
        state = inspect(chosen)[0]
        # what resume reads of it
        int(state["step"]), int(state.get("samples_consumed", 0)), float(state.get("loss_scale", {"scale": 1})["scale"])
    _quiet(ms_to_hf, run, work / "exported")


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
    if command == "plan" and draw(st.booleans()):  # a plan that gets past its first check
        argv += draw(st.sampled_from([[str(RECIPES[0])], [str(draw(st.sampled_from(RECIPES)))],
                                      ["--model", "llama3.2-1b", "--device", "910a"],
                                      ["--model", "llama3.2-3b", "--device", "910b", "--fit"]]))
    for _ in range(draw(st.integers(0, 5))):
        flag = draw(st.sampled_from(options + ["--no-such-flag", "-x", "--"] if options else ["--x"]))
        argv.append(flag)
        for _ in range(draw(st.integers(0, 2))):
            argv.append(draw(st.one_of(st.sampled_from(_ODD_TEXT + PLAN_VALUES), text,
                                       st.integers(-5, 10**20).map(str))))
    return argv


# Values plan's options take (it runs in full: analytical, no MindSpore, a fraction of a second).
PLAN_VALUES = ["1", "8", "65536", "1000000000", "2048", "131073", "28GB", "0GB", "512MB", "--fit", "train",
               "inference", "int8", "bf16", "micro_batch", "seq_len", "speed", "out.yaml", "910b4", "cpu",
               str(REPO / "data" / "zh_instruct_train.jsonl"), str(REPO / "data" / "zh_pref_train.jsonl"),
               "strategies.parallel.data=4", "train.micro_batch_size=0", "data.max_seq_len=nan"]


def parse_flags(case: List[str], work: Path) -> None:
    """Every sub-command's arguments parsed; `plan`'s also run, in the work directory (its
    --write-recipe writes a relative path there)."""
    import contextlib

    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        args = _parser().parse_args(case)
        if args.command == "plan":
            here = os.getcwd()
            os.chdir(work)
            try:
                args.func(args)
            finally:
                os.chdir(here)


# ---------------------------------------------------------------- the kinds and what counts

def nothing(case, work: Path) -> None:
    """The case is no file."""


@dataclass
class Kind:
    cases: Callable  # () -> a hypothesis strategy of cases
    lay_out: Callable  # (case, work dir): the case's files
    # (case, work dir) -> None each, in order, as commands read it; each raises the project's
    # own error to refuse, and a refusal must leave the files as that stage found them
    stages: tuple


KINDS = {
    "recipes": Kind(recipe_texts, lay_out_recipe, (read_recipe,)),
    "set": Kind(set_strings, nothing, (read_set,)),
    "records": Kind(record_cases, lay_out_records, (read_records,)),
    "exams": Kind(exam_cases, lay_out_exam, (read_exam,)),
    "hf": Kind(hf_cases, lay_out_hf, (convert_hf,)),
    "checkpoints": Kind(checkpoint_cases, lay_out_run, (repair, resume_and_export)),
    "flags": Kind(flag_lists, nothing, (parse_flags,)),
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
    for stage in KINDS[kind].stages:
        before = snapshot(work)
        try:
            try:
                stage(case, work)
            except SystemExit as exc:
                if exc.code not in (0, 2):
                    raise
                if exc.code == 2:
                    raise UsageError() from None
        except user_errors() as exc:
            if not isinstance(exc, UsageError):
                check_refusal(exc, [])
            after = snapshot(work)
            if after != before:
                changed = sorted(p for p in {*before, *after} if before.get(p, 0) != after.get(p, 0))
                raise Defect(f"a refusal ({exc}) changed {', '.join(changed[:4])} under {work}") from None
            return "refused"
    return "accepted"
