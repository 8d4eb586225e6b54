"""Spreadsheet data: CSV, TSV, Excel (.xlsx) and Parquet files read into the same records as
JSON and JSONL, one a row, each named `file:row` as a spreadsheet numbers it (the header is
row 1; in Parquet, which has no header row, the first record is row 1). And the column map,
data.columns, that names which column (or JSON key) holds each record key, in any file.

Read by well-kept libraries, not by hand: the standard csv module (quoted commas, embedded
newlines), openpyxl (the first sheet of a workbook) and pyarrow. An empty cell is an empty
string; a fully empty row is no record. A ShareGPT `conversations` or `messages` cell of a
CSV holds the turns as JSON text; a Parquet one may hold the list itself.
"""
from __future__ import annotations

import csv
import json
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

from .encodings import text_lines
from .errors import RecordError

DELIMITERS = {".csv": ",", ".tsv": "\t"}
TABLE_SUFFIXES = (*DELIMITERS, ".xlsx", ".xls", ".parquet")
# LLaMA-Factory's dataset_info.json `columns` names (its parser.py DatasetAttr) for our record
# keys, so that a map written for it works here too; its other names (messages, system, tools,
# history, chosen, rejected) are ours as well.
ALIASES = {"prompt": "instruction", "query": "input", "response": "output", "kto_tag": "label"}
# ShareGPT's turns and alpaca's history (LLaMA-Factory's): lists, as JSON text in a CSV cell
TURN_KEYS = ("conversations", "messages", "history")


@dataclass(frozen=True)
class ReadOptions:
    """How a run's files are read: data.columns (record key -> the file's column), data.encoding
    ("": UTF-8, or UTF-16 by its BOM) of text files, data.tags (LLaMA-Factory's role_tag ...
    system_tag; empty: each turn's own keys decide, data/turn_tags.py) and data.label_values
    (a KTO label's spellings, objectives/kto/records.py; empty: the defaults). `exclusive`: a
    dataset_info.json entry's map, which leaves every column it does not name unread, as
    LLaMA-Factory's parser.py does."""
    columns: Dict[str, str] = field(default_factory=dict)
    encoding: str = ""
    tags: Dict[str, str] = field(default_factory=dict)
    label_values: Dict[str, List[str]] = field(default_factory=dict)
    exclusive: bool = False

    @classmethod
    def of(cls, columns: Dict[str, str], encoding: str = "", tags: Dict[str, str] = None,
           label_values: Dict[str, List[str]] = None, exclusive: bool = False) -> "ReadOptions":
        """The options of a recipe's data.columns and data.encoding (or prepare-data's
        --column and --encoding), LLaMA-Factory's names read as ours."""
        return cls({ALIASES.get(key, key): column for key, column in columns.items()}, encoding, dict(tags or {}),
                   dict(label_values or {}), exclusive)

    @classmethod
    def of_data(cls, d) -> "ReadOptions":
        """The options of a recipe's data section (data.columns, encoding, tags, label_values)."""
        return cls.of(d.columns, d.encoding, d.tags, d.label_values)

    def column_of(self, key: str) -> str:
        """The file's name of record key `key`."""
        return self.columns.get(key, key)


def parse_columns(pairs: List[str]) -> Dict[str, str]:
    """prepare-data's --column KEY=NAME arguments as a column map."""
    bad = [pair for pair in pairs if "=" not in pair or not pair.split("=", 1)[1].strip()]
    if bad:
        raise RecordError(f"--column {bad[0]}: expected KEY=COLUMN, e.g. --column instruction=指令")
    return dict(pair.split("=", 1) for pair in pairs)


def is_table(path: Path) -> bool:
    return path.suffix.lower() in TABLE_SUFFIXES


def map_columns(record: object, columns: Dict[str, str], exclusive: bool = False) -> object:
    """`record` with each mapped column under its record key (a key the map does not name
    keeps its own name, so an unmapped file reads as before; `exclusive`: is left out)."""
    if not (columns or exclusive) or not isinstance(record, dict):
        return record
    mapped = {} if exclusive else {key: value for key, value in record.items() if key not in columns.values()}
    mapped.update({key: record[column] for key, column in columns.items() if column in record})
    return mapped


def _shown(name: str) -> str:
    """A column name as one line can show it: a newline in a quoted header cell escaped."""
    return name if name.isprintable() else repr(name)[1:-1]


def _cell(value: object) -> object:
    """A cell as the readers take it: text; a whole number stored as a float without its
    ".0"; an empty cell ""; a Parquet list or mapping as it is."""
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return value if isinstance(value, (str, list, dict)) else str(value)


def _text_rows(path: Path, encoding: str) -> Iterator[Tuple[int, List[object]]]:
    """(row, cells) of a CSV or TSV file; a quoted cell may hold the delimiter or newlines,
    so the row is counted in records, as a spreadsheet shows them, not in lines."""
    reader = csv.reader(text_lines(path, encoding, newline=""), delimiter=DELIMITERS[path.suffix.lower()])
    try:
        yield from enumerate(reader, start=1)
    except csv.Error as exc:
        raise RecordError(f"{path}:{reader.line_num}: not valid CSV ({exc})") from None


def _xlsx_rows(path: Path) -> Iterator[Tuple[int, List[object]]]:
    """(row, cells) of the first sheet of a workbook, formulas as Excel last computed them."""
    from openpyxl import load_workbook  # imported here: only an .xlsx needs it
    from openpyxl.utils.exceptions import InvalidFileException

    # What a damaged workbook raises from openpyxl's zip, deflate and XML layers (an XML
    # ParseError is a SyntaxError); the sheet is read lazily, so its rows can raise them too.
    damaged = (InvalidFileException, zipfile.BadZipFile, zlib.error, KeyError, IndexError, OSError, EOFError,
               ValueError, TypeError, SyntaxError)

    def unreadable(exc: Exception) -> RecordError:
        return RecordError(f"{path}: not a readable .xlsx workbook ({' '.join(str(exc).split())}); save it from Excel "
                           f"as .xlsx or CSV UTF-8")

    try:
        book = load_workbook(path, read_only=True, data_only=True)
        rows = enumerate(book.worksheets[0].iter_rows(values_only=True), start=1)
    except damaged as exc:
        raise unreadable(exc) from None
    try:
        while True:
            try:
                row = next(rows, None)
            except damaged as exc:
                raise unreadable(exc) from None
            if row is None:
                return
            yield row
    finally:
        book.close()


def _parquet_records(path: Path) -> Tuple[List[str], Iterator[Tuple[int, dict]]]:
    """(the column names, (row, record) of each record)."""
    import pyarrow  # imported here: only a Parquet file needs it
    import pyarrow.parquet as pq

    def unreadable(exc: Exception) -> RecordError:  # pyarrow's messages may end in a newline
        return RecordError(f"{path}: not a readable Parquet file ({' '.join(str(exc).split())})")

    try:
        table = pq.ParquetFile(path)
    except (pyarrow.ArrowException, OSError) as exc:
        raise unreadable(exc) from None

    def records():
        row = 0
        batches = table.iter_batches()
        while True:
            try:  # a damaged page shows only when its batch is decoded (ValueError: its text not UTF-8)
                batch = next(batches, None)
                decoded = [] if batch is None else batch.to_pylist()
            except (pyarrow.ArrowException, OSError, ValueError) as exc:
                raise unreadable(exc) from None
            if batch is None:
                return
            for record in decoded:
                row += 1
                yield row, {str(key): _cell(value) for key, value in record.items()}
    return [str(name) for name in table.schema_arrow.names], records()


def _sheet_records(path: Path, encoding: str) -> Tuple[List[str], Iterator[Tuple[int, object]]]:
    """(the header, (row, record or RecordError) of each non-empty row after it)."""
    if path.suffix.lower() == ".xls":  # Excel 97-2003's binary format: openpyxl reads .xlsx only
        raise RecordError(f"{path}: an Excel 97-2003 workbook; save it from Excel as .xlsx or CSV UTF-8")
    rows = _xlsx_rows(path) if path.suffix.lower() == ".xlsx" else _text_rows(path, encoding)
    header: List[str] = []
    for header_row, cells in rows:
        header = [str(_cell(name)).strip() for name in cells]
        if any(header):
            break
    while header and not header[-1]:  # Excel's trailing empty columns
        header.pop()
    twice = sorted({name for name in header if name and header.count(name) > 1})
    if twice:
        raise RecordError(f"{path}:{header_row}: the header row repeats {', '.join(map(_shown, twice))}; each column "
                          f"needs its own name")

    def records():
        for row, cells in rows:
            cells = [_cell(value) for value in cells]
            if not any(str(value).strip() for value in cells):
                continue
            if any(str(value).strip() for value in cells[len(header):]):
                yield row, RecordError(f"{path}:{row}: {len(cells)} cells, more than the header's "
                                       f"{len(header)} columns", "extra cells")
                continue
            # a column without a name (pandas' index) is no field
            yield row, {name: value for name, value in zip(header, cells + [""] * len(header)) if name}
    return header, records()


def _turns(record: dict, where: str) -> object:
    """A record with its JSON-text turns (or history) decoded, or the RecordError of bad JSON."""
    for key in TURN_KEYS:
        if record.get(key) == "":  # a row of a table holding both: the other's cell is empty, no field
            del record[key]
        if isinstance(record.get(key), str) and record[key].strip():
            try:
                record[key] = json.loads(record[key])
            except json.JSONDecodeError as exc:
                return RecordError(f"{where}: column '{key}' is not a JSON list of turns ({exc.msg} at character "
                                   f"{exc.pos})", "malformed JSON")
            except RecursionError:
                return RecordError(f"{where}: column '{key}' nests too deeply to read as JSON turns", "malformed JSON")
    return record


def table_records(path: Path, options: ReadOptions) -> Iterator[Tuple[int, object]]:
    """(row, record or RecordError) for each record of a table file, its columns mapped."""
    parquet = path.suffix.lower() == ".parquet"
    header, records = _parquet_records(path) if parquet else _sheet_records(path, options.encoding)
    missing = {key: column for key, column in options.columns.items() if column not in header}
    if missing and header:
        raise RecordError(f"{path}: no column {', '.join(repr(c) for c in missing.values())} (data.columns: "
                          f"{', '.join(f'{k}: {_shown(c)}' for k, c in missing.items())}); its columns: "
                          f"{', '.join(map(_shown, header))}")
    for row, record in records:
        if not isinstance(record, RecordError):
            record = _turns(map_columns(record, options.columns, options.exclusive), f"{path}:{row}")
        yield row, record
