"""KTO's records (train.objective: kto): a prompt, one reply and a boolean `label` (true: a
desirable reply, thumbs up; false: undesirable), read from the layouts the SFT readers take
(data/readers.py), in every file type they read (data/tables.py); LLaMA-Factory's `kto_tag`
column is read with data.columns: {label: kto_tag}.

- alpaca: `instruction`, optional `input`, `system` and `history`, the reply as `output`;
- sharegpt: `conversations` of {from, value} or `messages` of {role, content}, ending with the
  assistant's reply (LLaMA-Factory's KTO layout).

A label is a JSON boolean, or text, as a CSV, TSV or .xlsx cell holds it (and as the readers
give any table cell, Parquet's booleans included): true, 1 or yes for a desirable reply,
false, 0 or no for an undesirable one, in any case, spaces around ignored. Anything else is
refused in one line naming the file, row and column. Pure Python: validate reads them.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import List

from ...data.chat_template import Message
from ...data.readers import READ_KEYS, RecordError, parse_alpaca, parse_sharegpt
from ...data.record_kind import RecordKind

LABEL = "label"
TRUE_SPELLINGS, FALSE_SPELLINGS = ("true", "1", "yes"), ("false", "0", "no")
SKIP_HINT = "data.on_bad_record: skip drops such records"


@dataclass
class KtoRecord:
    where: str  # file:line
    prompt: List[Message]  # the turns before the reply, ending with the user's
    reply: str
    desirable: bool


def parse_label(record: dict, where: str) -> bool:
    """record['label'] as a boolean (the module docstring's spellings)."""
    if LABEL not in record:
        raise RecordError(f"{where}: field '{LABEL}' is missing; train.objective: kto expects a boolean '{LABEL}' "
                          f"(true for a desirable reply; data.columns: {{{LABEL}: kto_tag}} reads LLaMA-Factory's "
                          f"column); {SKIP_HINT}", f"missing '{LABEL}'")
    value = record[LABEL]
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower() if isinstance(value, (str, int)) else None
    if text in TRUE_SPELLINGS:
        return True
    if text in FALSE_SPELLINGS:
        return False
    raise RecordError(f"{where}: column '{LABEL}' holds {value!r}; expected true or false (true/1/yes or "
                      f"false/0/no, any case); {SKIP_HINT}", f"'{LABEL}' not a boolean")


def parse_kto(parse, raw: object, where: str) -> KtoRecord:
    """A labelled reply read by `parse`, the format's SFT parser (a partial: it pickles)."""
    messages = parse(raw, where).messages  # ends with the assistant's reply (the reader checks it)
    return KtoRecord(where, messages[:-1], messages[-1][1], parse_label(raw, where))


def is_kto_record(raw: object) -> bool:
    return isinstance(raw, dict) and LABEL in raw and not ("chosen" in raw and "rejected" in raw)


def misread(where: str) -> RecordError:
    """A labelled reply read by another objective."""
    return RecordError(f"{where}: the record is a labelled reply (one reply and a '{LABEL}'), a KTO record: labelled "
                       f"replies train with train.objective: kto", "labelled reply read as another kind")


def none_in_file(path) -> str:
    return (f"train.objective=kto: {path} holds no labelled reply (no record has a '{LABEL}'; data.columns: "
            f"{{{LABEL}: kto_tag}} reads LLaMA-Factory's column)")


PARSERS = {"alpaca": partial(parse_kto, parse_alpaca), "sharegpt": partial(parse_kto, parse_sharegpt)}
RECORDS = RecordKind("labelled replies", PARSERS, {fmt: READ_KEYS[fmt] | {LABEL} for fmt in PARSERS},
                     is_kto_record, misread, f"missing '{LABEL}'", none_in_file)
