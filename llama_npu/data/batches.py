"""A seeded, resumable stream of training batches.

The order of epoch e is a permutation drawn from (seed, e), so the stream is a pure
function of (seed, samples consumed): resuming only needs the count the checkpoint stored.
Samples come from a source with len() and iterate(indices): a list in memory
(ListSamples) or a prepared MindRecord directory (mindrecord.MindRecordSamples).
"""
from __future__ import annotations

from typing import Callable, Iterator, Sequence

import numpy as np

from ..model.tokens import PAD_ID
from .samples import Sample, pad_batch


class ListSamples:
    def __init__(self, samples: Sequence[Sample]):
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def iterate(self, indices) -> Iterator[Sample]:
        return (self.samples[i] for i in indices)


class BatchStream:
    """Micro-batches of `batch_size` samples for this rank.

    `samples_consumed` counts the samples of all data-parallel ranks: every micro-batch
    step takes batch_size x world consecutive positions of the epoch's order, and rank r
    reads the r-th block of batch_size of them.
    """

    def __init__(self, source, batch_size: int, length: int, seed: int, samples_consumed: int = 0,
                 rank: int = 0, world: int = 1):
        if len(source) == 0:
            raise ValueError("no training samples")
        self.source = source
        self.batch_size = batch_size
        self.length = length
        self.seed = seed
        self.samples_consumed = samples_consumed
        self.rank, self.world = rank, world
        self._epoch = None
        self._iterator = None

    @property
    def epoch(self) -> int:
        return self.samples_consumed // len(self.source)

    def _owns(self, position):
        return (position // self.batch_size) % self.world == self.rank

    def _start_epoch(self, epoch: int, position: int) -> None:
        n = len(self.source)
        order = np.random.default_rng([self.seed, epoch]).permutation(n)
        positions = np.arange(position, n)
        mine = positions[self._owns(epoch * n + positions)]
        self._epoch, self._iterator = epoch, self.source.iterate(order[mine])

    def next_batch(self):
        """(ids, labels[, segment_ids]), each (batch_size, length) int32."""
        picked = []
        for position in range(self.samples_consumed, self.samples_consumed + self.batch_size * self.world):
            epoch, offset = divmod(position, len(self.source))
            if epoch != self._epoch:
                self._start_epoch(epoch, offset)
            if self._owns(position):
                picked.append(next(self._iterator))
        self.samples_consumed += self.batch_size * self.world
        if hasattr(self.source, "pad"):  # a source whose items are not samples (an objective's, objectives/)
            return self.source.pad(picked, self.length)
        return pad_batch(picked, self.length, PAD_ID)


def first_batches(stream_at: Callable[[int], BatchStream], k: int) -> list:
    """One step's k micro-batches from the start of the stream `stream_at(0)`, for a graph
    compiled before a checkpoint is loaded."""
    example = stream_at(0)
    return [example.next_batch() for _ in range(k)]
