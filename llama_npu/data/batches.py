"""A seeded, resumable stream of training batches.

The order of epoch e is a permutation drawn from (seed, e), so the stream is a pure
function of (seed, samples consumed): resuming only needs the count the checkpoint stored.
Samples come from a source with len() and iterate(indices): a list in memory
(ListSamples) or a prepared MindRecord directory (mindrecord.MindRecordSamples).
"""
from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from ..model import PAD_ID
from .samples import Sample, pad_batch


class ListSamples:
    def __init__(self, samples: Sequence[Sample]):
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def iterate(self, indices) -> Iterator[Sample]:
        return (self.samples[i] for i in indices)


class BatchStream:
    def __init__(self, source, batch_size: int, length: int, seed: int, samples_consumed: int = 0):
        if len(source) == 0:
            raise ValueError("no training samples")
        self.source = source
        self.batch_size = batch_size
        self.length = length
        self.seed = seed
        self.samples_consumed = samples_consumed
        self._iterator = None

    @property
    def epoch(self) -> int:
        return self.samples_consumed // len(self.source)

    def _next_sample(self) -> Sample:
        epoch, position = divmod(self.samples_consumed, len(self.source))
        if position == 0 or self._iterator is None:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.source))
            self._iterator = self.source.iterate(order[position:])
        self.samples_consumed += 1
        return next(self._iterator)

    def next_batch(self):
        """(ids, labels[, segment_ids]), each (batch_size, length) int32."""
        return pad_batch([self._next_sample() for _ in range(self.batch_size)], self.length, PAD_ID)
