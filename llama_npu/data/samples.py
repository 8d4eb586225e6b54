"""Tokenized training samples: ids and labels of one conversation, fitted to the length
the model is trained on."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Sequence

import numpy as np

from ..model import IGNORE_ID
from .chat_template import Message, encode_chat


@dataclass
class Sample:
    input_ids: List[int]
    labels: List[int]


@dataclass
class FitReport:
    read: int = 0
    kept: int = 0
    truncated: int = 0
    dropped_no_answer: int = 0
    lengths: List[int] = field(default_factory=list)


def fit_length(ids: List[int], labels: List[int], max_len: int):
    """Cut to `max_len` tokens, keeping the prompt and as much of the answer as fits.
    Returns None when no target token would remain."""
    ids, labels = ids[:max_len], labels[:max_len]
    # labels[0] is never a target (it has no preceding token to predict it from).
    if not any(l != IGNORE_ID for l in labels[1:]):
        return None
    return ids, labels


def tokenize_conversations(tokenizer, conversations: Sequence[Sequence[Message]], max_len: int,
                           train_on_prompt: bool = False):
    """Samples of at most `max_len` tokens (the model sees max_len - 1 positions, each
    predicting the next token) and a report of what was cut or dropped."""
    report = FitReport()
    samples = []
    for messages in conversations:
        report.read += 1
        ids, labels = encode_chat(tokenizer, messages, train_on_prompt)
        report.lengths.append(len(ids))
        fitted = fit_length(ids, labels, max_len)
        if fitted is None:
            report.dropped_no_answer += 1
            continue
        report.truncated += len(ids) > max_len
        samples.append(Sample(*fitted))
        report.kept += 1
    return samples, report


def pad_batch(samples: Sequence[Sample], length: int, pad_id: int):
    """(B, length) int32 arrays of ids and labels, right-padded."""
    ids = np.full((len(samples), length), pad_id, dtype=np.int32)
    labels = np.full((len(samples), length), IGNORE_ID, dtype=np.int32)
    for row, sample in enumerate(samples):
        ids[row, :len(sample.input_ids)] = sample.input_ids
        labels[row, :len(sample.labels)] = sample.labels
    return ids, labels
