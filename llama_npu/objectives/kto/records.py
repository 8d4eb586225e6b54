"""KTO's records (train.objective: kto): a prompt, one reply and a boolean `label` (true: a
desirable reply, thumbs up; false: undesirable), read from the layouts the SFT readers take
(data/readers.py), in every file type they read (data/tables.py); LLaMA-Factory's `kto_tag`
column is read with data.columns: {label: kto_tag}.

- alpaca: `instruction`, optional `input`, `system` and `history`, the reply as `output`;
- sharegpt: `conversations` of {from, value} or `messages` of {role, content}, ending with the
  assistant's reply (LLaMA-Factory's KTO layout).

A label is a JSON boolean (LLaMA-Factory's kto_tag), or a value, as a CSV, TSV or .xlsx cell
holds it (and as the readers give any table cell, Parquet's booleans included), read by
data.label_values: {desirable: [...], undesirable: [...]}, in any case, spaces around
ignored; by default true, 1, yes or a thumbs up for a desirable reply, false, 0, no or a
thumbs down for an undesirable one. Anything else is a bad record, its line naming the file,
row, the column as the file names it, the value and the values accepted. Pure Python:
validate reads them.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import List

from ...data.chat_template import Message
from ...data.label_values import LABEL_VALUES
from ...data.readers import READ_KEYS, RecordError, parse_alpaca, parse_sharegpt
from ...data.record_kind import RecordKind
from ...data.tables import ReadOptions

LABEL = "label"
# data.label_values' keys and their defaults (a key the recipe leaves out keeps its default)
SKIP_HINT = "data.on_bad_record: skip drops such records"


@dataclass
class KtoRecord:
    where: str  # file:line
    prompt: List[Message]  # the turns before the reply, ending with the user's
    reply: str
    desirable: bool


def label_values(given: dict) -> dict:
    """data.label_values with its defaults: {desirable: (values...), undesirable: (...)}."""
    return {side: tuple(str(v) for v in given.get(side, default)) for side, default in LABEL_VALUES.items()}


def parse_label(record: dict, where: str, options: ReadOptions = ReadOptions()) -> bool:
    """record['label'] as a boolean (the module docstring's values)."""
    column = options.column_of(LABEL)
    if LABEL not in record:
        raise RecordError(f"{where}: field '{column}' is missing; train.objective: kto expects a label in it "
                          f"(true for a desirable reply; data.columns: {{kto_tag: COLUMN}} reads another column); "
                          f"{SKIP_HINT}", f"missing '{LABEL}'")
    value = record[LABEL]
    if isinstance(value, bool):
        return value
    values = label_values(options.label_values)
    text = str(value).strip().lower() if isinstance(value, (str, int)) else None
    for side, desirable in (("desirable", True), ("undesirable", False)):
        if text in (v.strip().lower() for v in values[side]):
            return desirable
    raise RecordError(f"{where}: column '{column}' holds {value!r}; expected a desirable value "
                      f"({', '.join(values['desirable'])}) or an undesirable one ({', '.join(values['undesirable'])}), "
                      f"in any case (data.label_values); {SKIP_HINT}", f"label not in data.label_values")


def parse_kto(parse, raw: object, where: str, options: ReadOptions = ReadOptions()) -> KtoRecord:
    """A labelled reply read by `parse`, the format's SFT parser (a partial: it pickles)."""
    messages = parse(raw, where, options).messages  # ends with the assistant's reply (the reader checks it)
    return KtoRecord(where, messages[:-1], messages[-1][1], parse_label(raw, where, options))


def is_kto_record(raw: object) -> bool:
    return isinstance(raw, dict) and LABEL in raw and not ("chosen" in raw and "rejected" in raw)


def misread(where: str) -> RecordError:
    """A labelled reply read by another objective."""
    return RecordError(f"{where}: the record is a labelled reply (one reply and a '{LABEL}'), a KTO record: labelled "
                       f"replies train with train.objective: kto", "labelled reply read as another kind")


def none_in_file(path) -> str:
    return (f"train.objective=kto: {path} holds no labelled reply (no record has a '{LABEL}'; data.columns: "
            f"{{kto_tag: COLUMN}} reads another column)")


PARSERS = {"alpaca": partial(parse_kto, parse_alpaca), "sharegpt": partial(parse_kto, parse_sharegpt)}
RECORDS = RecordKind("labelled replies", PARSERS, {fmt: READ_KEYS[fmt] | {LABEL} for fmt in PARSERS},
                     is_kto_record, misread, f"missing '{LABEL}'", none_in_file)
