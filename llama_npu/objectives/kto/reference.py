"""kto.reference precomputed: the starting weights' summed log-probs of every training reply
and of every KL row the run will score, computed once before step 1 through the shared pass
(objectives/reference_pass.py: stored in the run directory with the digests of the weights
and of the rows, reused on resume when both match, refused otherwise).

A step's KL rows pair each of its records' prompts with the reply of the step's previous
record (replies.py), so they depend on which records a step draws. The stream's order is a
pure function of the seed and the layout (data/batches.py), so the pairs of every step up to
train.max_steps, on every rank, are known before step 1: `planned_pairs` draws them from the
same BatchStream over record indices. The pass thus scores N replies and up to max_steps x
global batch KL rows (one per record a step, the repeats of later epochs included: a pair
drawn twice is scored once), where TRL's precompute_ref_log_probs scores its fixed KL set
of N rows once. A resume that changes the seed, the batch sizes, the data-parallel ranks or
train.max_steps changes the planned rows, so its stored reference no longer matches and is
refused, naming both digests.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...data.batches import BatchStream
from ...data.samples import Sample
from ...strategies.accumulation import accumulation_steps
from ..reference_pass import precomputed_reference
from .replies import kl_partners, kl_row


class _Indices:
    """A source whose items are their own indices: the stream's draw without the data."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def iterate(self, indices):
        return ((int(i), int(i)) for i in indices)

    def pad(self, picked, length):
        return np.array([i for i, _ in picked], np.int64)


def planned_pairs(recipe, records: int, ranks: int) -> list:
    """(record, partner) of every KL row of the run's steps on every rank, in first-drawn order."""
    t, k = recipe.train, accumulation_steps(recipe)
    pairs = {}
    for rank in range(ranks):
        stream = BatchStream(_Indices(records), t.micro_batch_size, 0, t.seed, rank=rank, world=ranks)
        for _ in range(t.max_steps):
            drawn = np.concatenate([stream.next_batch() for _ in range(k)])
            pairs.update(dict.fromkeys(zip(drawn.tolist(), drawn[kl_partners(len(drawn))].tolist())))
    return list(pairs)


@dataclass
class _Row:
    rows: tuple  # one Sample, as reference_pass scores an item


def kl_item(samples, i: int, j: int, length: int) -> _Row:
    a, b = samples[i].sample, samples[j].sample
    ids, labels = kl_row(np.asarray(a.input_ids), np.asarray(a.labels), np.asarray(b.input_ids), np.asarray(b.labels),
                         length)
    return _Row((Sample(ids.tolist(), labels.tolist()),))


def fill_reference(recipe, run_dir, net, chunk_size, source, ranks: int, writes: bool) -> dict:
    """Fills `source.reference` with the replies' reference log-probs; returns the KL rows'
    as {(record, partner): log-prob}."""
    length = recipe.data.max_seq_len + 1
    pairs = planned_pairs(recipe, len(source), ranks)
    items = list(source.samples) + [kl_item(source.samples, i, j, length) for i, j in pairs]
    log_probs = precomputed_reference(run_dir, net, chunk_size, items, recipe.train.micro_batch_size, length, writes,
                                      unit="row")[:, 0]
    source.reference = log_probs[:len(source)].astype(np.float32)
    return dict(zip(pairs, log_probs[len(source):].tolist()))
