"""Preference pairs (train.objective: dpo) tokenized: each pair record (records.py) becomes
two samples that share the prompt, its chosen and its rejected reply as the assistant's
closing turn, and a micro-batch of pairs two stacks of rows."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Sequence, Tuple

from ...common.console import progress_bar
from ...data.chat_template import assemble_chat, role_headers
from ...data.samples import TOKENIZE_BATCH, Sample, fit_length, pad_items
from .records import PairRecord


@dataclass
class PairSample:
    chosen: Sample
    rejected: Sample

    @property
    def rows(self) -> tuple:
        """The pair's rows in a batch's order (objectives/reference_pass.py)."""
        return self.chosen, self.rejected


@dataclass
class PairReport:
    read: int = 0
    kept: int = 0
    truncated: int = 0  # kept with the longer reply cut at the length (dpo.on_long_pair: truncate)
    dropped: int = 0  # left out for a reply too long (dpo.on_long_pair: drop)
    no_room: List[Tuple[str, int]] = field(default_factory=list)  # (file:line, prompt tokens): no reply fits

    def describe(self, max_len: int) -> str:
        return (f"{self.kept} of {self.read} preference pairs kept ({self.truncated} truncated, {self.dropped} "
                f"dropped: a row past {max_len} tokens; {len(self.no_room)} dropped: no room for a reply)")


def _rows(headers, record: PairRecord, contents: list):
    """(chosen ids, labels), (rejected ids, labels), prompt length: the prompt's turns and
    each reply as the assistant's closing turn."""
    roles = [role for role, _ in record.prompt] + ["assistant"]
    prompt, chosen, rejected = contents[:-2], contents[-2], contents[-1]
    chosen_row = assemble_chat(roles, prompt + [chosen], headers)
    rejected_row = assemble_chat(roles, prompt + [rejected], headers)
    return chosen_row, rejected_row, len(chosen_row[0]) - len(chosen) - 1  # the reply and its <|eot_id|>


def _fit_pair(headers, record: PairRecord, contents: list, max_len: int, on_long_pair: str, report: PairReport):
    """The pair as samples of at most `max_len` tokens, or None (counted in `report`)."""
    (chosen_ids, chosen_labels), (rejected_ids, rejected_labels), prompt_len = _rows(headers, record, contents)
    report.read += 1
    if prompt_len >= max_len:  # labels[prompt_len] is the reply's first target
        report.no_room.append((record.where, prompt_len))
        return None
    if max(len(chosen_ids), len(rejected_ids)) > max_len:
        if on_long_pair == "drop":
            report.dropped += 1
            return None
        report.truncated += 1
    report.kept += 1
    return PairSample(Sample(*fit_length(chosen_ids, chosen_labels, max_len)),
                      Sample(*fit_length(rejected_ids, rejected_labels, max_len)))


def tokenize_pairs(tokenizer, records: Sequence[PairRecord], max_len: int,
                   on_long_pair: str = "truncate", bar: bool = True) -> Tuple[List[PairSample], PairReport]:
    """Pairs of samples of at most `max_len` tokens (data.max_seq_len + 1, as for SFT), in
    the Llama 3 chat format; only the reply tokens and their <|eot_id|> are targets. `bar`:
    a progress bar (not for `validate`, whose output is its list of problems)."""
    headers, report, pairs = role_headers(tokenizer), PairReport(), []
    for record, contents in _encoded(tokenizer, records, bar):
        pair = _fit_pair(headers, record, contents, max_len, on_long_pair, report)
        if pair is not None:
            pairs.append(pair)
    return pairs, report


def _encoded(tokenizer, records: Sequence[PairRecord], bar: bool):
    """(record, the token ids of its prompt turns, chosen and rejected reply), encoded in batches."""
    with progress_bar(len(records), "tokenize", "pair", enabled=bar) as progress:
        for start in range(0, len(records), TOKENIZE_BATCH):
            chunk = records[start:start + TOKENIZE_BATCH]
            texts = [t for r in chunk for t in [c for _, c in r.prompt] + [r.chosen, r.rejected]]
            encoded = iter(e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False))
            for record in chunk:
                yield record, [next(encoded) for _ in range(len(record.prompt) + 2)]
            progress.update(len(chunk))


def pair_lengths(tokenizer, records: Sequence[PairRecord]) -> List[Tuple[int, int]]:
    """(prompt tokens, tokens of the longer row) of each pair, untruncated: what a length must
    hold for the pair to keep a reply (more than the prompt) or to stay whole (the row)."""
    headers, lengths = role_headers(tokenizer), []
    for record, contents in _encoded(tokenizer, records, bar=False):
        chosen_row, rejected_row, prompt_len = _rows(headers, record, contents)
        lengths.append((prompt_len, max(len(chosen_row[0]), len(rejected_row[0]))))
    return lengths


def pad_pair_batch(pairs: Sequence[PairSample], length: int, pad_id: int):
    """(ids, labels), right-padded (2P, length) int32 arrays: the P chosen rows first, then
    the P rejected rows in the same order, as TRL 0.24's DPOTrainer.concatenated_inputs
    (trl/trainer/dpo_trainer.py) stacks them, so that one forward pass scores both halves of
    every pair."""
    return pad_items(pairs, length, pad_id)
