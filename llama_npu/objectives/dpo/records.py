"""Preference pairs' records (train.objective: dpo): a prompt with a better reply (`chosen`)
and a worse one (`rejected`), read from the layouts the SFT readers take (data/readers.py).

- alpaca: `instruction`, optional `input` and `system`, `chosen`, `rejected`;
- sharegpt: `conversations` of {from, value} or `messages` of {role, content} as the prompt
  history, ending with the user; `chosen` and `rejected` are the last assistant reply.

A reply is a string or an assistant message ({role, content} or {from, value}). A record is
a pair when it has `chosen` and `rejected`. Pure Python: validate reads them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

from ...data.chat_template import Message
from ...data.readers import (READ_KEYS, RecordError, SkipReport, _object, _string, alpaca_prompt, read_dataset,
                             sharegpt_turns)
from ...data.record_kind import RecordKind
from ...data.tables import ReadOptions
from ...data.turn_tags import role_of, turn_keys

# The keys that make a record a preference pair.
PAIR_KEYS = ("chosen", "rejected")
# Named by every error about a pair's content, as the way to train on the other pairs.
SKIP_HINT = "data.on_bad_record: skip drops such pairs"


@dataclass
class PairRecord:
    where: str  # file:line
    prompt: List[Message]  # the turns before the reply, ending with the user's
    chosen: str
    rejected: str


def _reply(record: dict, key: str, where: str, tags: dict) -> str:
    """record[key] as the reply's text: a string, or an assistant message (read by `tags`,
    data/turn_tags.py)."""
    holder, text_key, at = record, key, where
    value = record.get(key)
    if isinstance(value, dict):
        role_key, text_key = turn_keys(value, tags)
        role = value.get(role_key, tags.get("assistant_tag", "assistant"))  # a message without a role is the reply
        if role_of(role, tags) != "assistant":
            raise RecordError(f"{where}: '{key}' is a message from {role!r}; expected the assistant's reply; "
                              f"{SKIP_HINT}", f"'{key}' not from the assistant")
        holder, at = value, f"{where} '{key}'"
    try:
        return _string(holder, text_key, at, required=True, what=f"empty '{key}'")
    except RecordError as exc:
        raise RecordError(f"{exc}; {SKIP_HINT}", exc.reason) from None


def _pair(record: dict, where: str, prompt: List[Message], tags: dict) -> PairRecord:
    chosen, rejected = _reply(record, "chosen", where, tags), _reply(record, "rejected", where, tags)
    if chosen.strip() == rejected.strip():
        raise RecordError(f"{where}: 'chosen' equals 'rejected'; a pair needs two different replies; {SKIP_HINT}",
                          "chosen equal to rejected")
    return PairRecord(where, prompt, chosen, rejected)


def _pair_object(raw: object, where: str, prompt_keys: str) -> dict:
    record = _object(raw, where, f"{prompt_keys}, 'chosen' and 'rejected'")
    if not any(key in record for key in PAIR_KEYS):
        raise RecordError(f"{where}: not a preference pair: train.objective: dpo expects 'chosen' and 'rejected' "
                          f"replies; {SKIP_HINT}", "not a pair")
    return record


def parse_alpaca_pair(raw: object, where: str, options: ReadOptions = ReadOptions()) -> PairRecord:
    record = _pair_object(raw, where, "'instruction'")
    return _pair(record, where, alpaca_prompt(record, where), options.tags)


def parse_sharegpt_pair(raw: object, where: str, options: ReadOptions = ReadOptions()) -> PairRecord:
    record = _pair_object(raw, where, "'conversations' or 'messages'")
    turns = sharegpt_turns(record, where, options, "user", ", whom 'chosen' and 'rejected' answer")
    return _pair(record, where, turns, options.tags)


def is_pair(raw: object) -> bool:
    return isinstance(raw, dict) and all(key in raw for key in PAIR_KEYS)


def misread(where: str) -> RecordError:
    """A pair read by another objective (as SFT data)."""
    return RecordError(f"{where}: the record is a preference pair ('chosen' and 'rejected'), read as SFT data: "
                       f"pairs train with train.objective: dpo, from data.train_files", "preference pair read as SFT")


def none_in_file(path) -> str:
    return (f"train.objective=dpo: {path} holds no preference pair (no record has 'chosen' and 'rejected'); "
            f"DPO trains on pairs, SFT records train with train.objective: sft")


PARSERS = {"alpaca": parse_alpaca_pair, "sharegpt": parse_sharegpt_pair}
RECORDS = RecordKind("preference pairs", PARSERS,
                     {fmt: READ_KEYS[fmt] - {"output"} | set(PAIR_KEYS) for fmt in PARSERS},
                     is_pair, misread, "not a pair", none_in_file, ranking=True)


def read_pairs(paths, fmt: str, on_bad_record: str = "error",
               options: ReadOptions = ReadOptions()) -> Tuple[List[PairRecord], SkipReport]:
    """All good pairs of `paths`; a bad record stops the read (error) or is counted (skip)."""
    return read_dataset(paths, fmt, on_bad_record, options, RECORDS)
