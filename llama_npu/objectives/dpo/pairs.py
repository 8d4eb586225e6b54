"""Preference pairs (train.objective: dpo) tokenized: each pair record (records.py) becomes
two samples that share the prompt, its chosen and its rejected reply as the assistant's
closing turn, and a micro-batch of pairs two stacks of rows."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Sequence, Tuple

from ...common.console import progress_bar
from ...data.chat_template import assemble_chat, role_headers
from ...data.samples import TOKENIZE_BATCH, Sample, pad_items
from ...data.truncation import DEFAULT, CutCounts, layout, prompt_cut, take
from ...model.tokens import IGNORE_ID
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
    cuts: CutCounts = field(default_factory=CutCounts)  # by file: read, truncated, dropped
    no_room: List[Tuple[str, int]] = field(default_factory=list)  # (file:line, prompt tokens): keep_prompt's drops

    read = property(lambda self: self.cuts.total("read"))
    truncated = property(lambda self: self.cuts.total("truncated"))
    dropped = property(lambda self: self.cuts.total("dropped"))
    kept = property(lambda self: self.read - self.dropped)


def _rows(headers, record: PairRecord, contents: list):
    """(chosen ids, labels), (rejected ids, labels): the prompt's turns and each reply as the
    assistant's closing turn, the reply and its <|eot_id|> the only targets (a history's
    assistant turns are prompt here, as TRL scores the completion only)."""
    roles = [role for role, _ in record.prompt] + ["assistant"]
    prompt, rows = contents[:-2], []
    for reply in contents[-2:]:
        ids, labels = assemble_chat(roles, prompt + [reply], headers)
        start = len(ids) - len(reply) - 1
        rows.append((ids, [IGNORE_ID] * start + labels[start:]))
    return rows


def _fit_pair(headers, record: PairRecord, contents: list, max_len: int, truncation: str, report: PairReport):
    """The pair as samples of at most `max_len` tokens cut under `truncation` (data/truncation.py:
    one prompt cut, the longer reply deciding both replies' length), or None (counted in `report`)."""
    rows = _rows(headers, record, contents)
    lay = layout(rows[0][0], headers["assistant"], headers["system"])
    replies = [len(ids) - lay.reply for ids, _ in rows]  # each reply and its <|eot_id|>
    cut = prompt_cut(truncation, lay, max(replies), max_len)
    if cut is None and truncation == "keep_prompt":
        report.no_room.append((record.where, lay.reply))
    truncated = cut is not None and (cut[1] < max(replies) or cut[0] != [(0, lay.reply)])
    report.cuts.count_record(record.where, truncated, cut is None)
    if cut is None:
        return None
    kept = cut[0] + [(lay.reply, lay.reply + cut[1])]
    return PairSample(*(Sample(take(ids, kept), take(labels, kept)) for ids, labels in rows))


def tokenize_pairs(tokenizer, records: Sequence[PairRecord], max_len: int,
                   truncation: str = DEFAULT, bar: bool = True) -> Tuple[List[PairSample], PairReport]:
    """Pairs of samples of at most `max_len` tokens (data.max_seq_len + 1, as for SFT), in
    the Llama 3 chat format, longer pairs cut under `truncation` (data.truncation); only the
    reply tokens and their <|eot_id|> are targets. `bar`: a progress bar (not for `validate`,
    whose output is its list of problems)."""
    headers, report, pairs = role_headers(tokenizer), PairReport(), []
    for record, contents in _encoded(tokenizer, records, bar):
        pair = _fit_pair(headers, record, contents, max_len, truncation, report)
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
        (chosen, _), (rejected, _) = _rows(headers, record, contents)
        prompt_len = len(chosen) - len(contents[-2]) - 1  # the reply and its <|eot_id|>
        lengths.append((prompt_len, max(len(chosen), len(rejected))))
    return lengths


def pad_pair_batch(pairs: Sequence[PairSample], length: int, pad_id: int):
    """(ids, labels), right-padded (2P, length) int32 arrays: the P chosen rows first, then
    the P rejected rows in the same order, as TRL 0.24's DPOTrainer.concatenated_inputs
    (trl/trainer/dpo_trainer.py) stacks them, so that one forward pass scores both halves of
    every pair."""
    return pad_items(pairs, length, pad_id)
