"""A seeded, resumable stream of training batches.

The order of epoch e is a permutation drawn from (seed, e), so the stream is a pure
function of (seed, samples consumed): resuming only needs the count the checkpoint stored.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..model import PAD_ID
from .samples import Sample, pad_batch


class BatchStream:
    def __init__(self, samples: Sequence[Sample], batch_size: int, length: int, seed: int,
                 samples_consumed: int = 0):
        if not samples:
            raise ValueError("no training samples")
        self.samples = samples
        self.batch_size = batch_size
        self.length = length
        self.seed = seed
        self.samples_consumed = samples_consumed
        self._epoch = -1
        self._order = None

    def _order_of(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._order, self._epoch = rng.permutation(len(self.samples)), epoch
        return self._order

    @property
    def epoch(self) -> int:
        return self.samples_consumed // len(self.samples)

    def next_batch(self):
        """(ids, labels), each (batch_size, length) int32."""
        n = len(self.samples)
        picked = []
        for _ in range(self.batch_size):
            epoch, position = divmod(self.samples_consumed, n)
            picked.append(self.samples[self._order_of(epoch)[position]])
            self.samples_consumed += 1
        return pad_batch(picked, self.length, PAD_ID)
