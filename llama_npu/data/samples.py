"""Tokenized training samples: ids and labels of one record, fitted to the length the
model is trained on."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import numpy as np

from ..common.console import progress_bar
from ..model.tokens import BOS_ID, IGNORE_ID
from .chat_template import assemble_chat, role_headers
from .readers import Record
from .tokenizer import SPECIAL_TOKENS

END_OF_TEXT_ID = SPECIAL_TOKENS["<|end_of_text|>"]  # closes a plain-text document
TOKENIZE_BATCH = 1024  # records per tokenizer call: the Rust tokenizer parallelises a batch


@dataclass
class Sample:
    input_ids: List[int]
    labels: List[int]
    segment_ids: Optional[List[int]] = None  # packed rows: 1..n per sample, 0 for padding


@dataclass
class FitReport:
    read: int = 0
    kept: int = 0
    truncated: int = 0
    dropped_no_answer: int = 0
    lengths: List[int] = field(default_factory=list)  # before truncation


def fit_length(ids: List[int], labels: List[int], max_len: int):
    """Cut to `max_len` tokens, keeping the prompt and as much of the answer as fits.
    Returns None when no target token would remain."""
    ids, labels = ids[:max_len], labels[:max_len]
    # labels[0] is never a target (no token precedes it to predict it from).
    if not any(l != IGNORE_ID for l in labels[1:]):
        return None
    return ids, labels


def _encode(tokenizer, headers, record: Record, content_ids, train_on_prompt: bool):
    if record.text is not None:
        ids = [BOS_ID] + list(content_ids[0]) + [END_OF_TEXT_ID]
        # The first label stays IGNORE_ID so a packed document is never predicted from the
        # one before it.
        return ids, [IGNORE_ID] + ids[1:]
    return assemble_chat([r for r, _ in record.messages], content_ids, headers, train_on_prompt)


def tokenize_records(tokenizer, records: Sequence[Record], max_len: int, train_on_prompt: bool = False):
    """Samples of at most `max_len` tokens and a report of what was cut or dropped.
    Tokenizes in batches across records for speed."""
    headers = role_headers(tokenizer)
    report = FitReport()
    samples = []
    with progress_bar(len(records), "tokenize", "record") as bar:
        for start in range(0, len(records), TOKENIZE_BATCH):
            chunk = records[start:start + TOKENIZE_BATCH]
            samples += _tokenize_chunk(tokenizer, headers, chunk, max_len, train_on_prompt, report)
            bar.update(len(chunk))
    return samples, report


def _tokenize_chunk(tokenizer, headers, chunk, max_len: int, train_on_prompt: bool, report: FitReport) -> list:
    texts = [t for r in chunk for t in ([r.text] if r.text is not None else [c for _, c in r.messages])]
    encoded = iter(e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False))
    samples = []
    for record in chunk:
        turns = 1 if record.text is not None else len(record.messages)
        ids, labels = _encode(tokenizer, headers, record, [next(encoded) for _ in range(turns)], train_on_prompt)
        report.read += 1
        report.lengths.append(len(ids))
        fitted = fit_length(ids, labels, max_len)
        if fitted is None:
            report.dropped_no_answer += 1
            continue
        report.truncated += len(ids) > max_len
        samples.append(Sample(*fitted))
        report.kept += 1
    return samples


def pad_batch(samples: Sequence[Sample], length: int, pad_id: int):
    """Right-padded (B, length) int32 arrays: (ids, labels), plus segment ids for packed rows."""
    ids = np.full((len(samples), length), pad_id, dtype=np.int32)
    labels = np.full((len(samples), length), IGNORE_ID, dtype=np.int32)
    segments = np.zeros((len(samples), length), dtype=np.int32)
    for row, sample in enumerate(samples):
        ids[row, :len(sample.input_ids)] = sample.input_ids
        labels[row, :len(sample.labels)] = sample.labels
        if sample.segment_ids is not None:
            segments[row, :len(sample.segment_ids)] = sample.segment_ids
    if samples and samples[0].segment_ids is not None:
        return ids, labels, segments
    return ids, labels
