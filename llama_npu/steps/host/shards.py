"""Data parallel with the optimizer on the host (strategies.offload): which part of the states
each rank's host holds, and the exchange of what the ranks updated.

The matrices' elements, concatenated in the order of the card's trainable parameters, are cut
into N ranges of ceil(M / N): rank r owns [r S, min(M, (r + 1) S)), a range that may start and
end inside a tensor. Its host holds the fp32 master weights, the two moments and the fp32
gradient accumulators of that range only, so a node's host holds one set of states, not one a
rank. Every matrix is decayed, so one range needs no per-element decay. The vectors (the
RMSNorm gains, about 0.01% of a Llama) are not cut: every rank holds and updates them, so
that the weights exchanged are the matrices' alone. After each update the ranks exchange the
updated ranges with an AllGather on the card (CardExchange: the host sends its range in the
compute dtype, the card gathers the whole and assigns each matrix its slice). To save, they
gather the fp32 states on the host (ShardLayout.gather, in fixed-size chunks, so that a
rank's host holds one chunk of every rank and the tensors being completed at a time).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from mindspore import ParameterTuple, Tensor, nn, ops

# Elements a rank sends per AllGather (16 MB of fp32): the host holds N of them at a time.
CHUNK = 2**22


def is_matrix(param) -> bool:
    """Decayed, held in the compute dtype on the card, and cut across the ranks; vectors (the
    RMSNorm gains) are none of these, as in steps/optimizer.py."""
    return len(param.shape) >= 2


class _AllGather(nn.Cell):
    """Every rank's equal-shaped range, concatenated along dimension 0 in rank order
    (mindspore/ops/operations/comm_ops.py AllGather: the same shape on every rank, hence the
    ranges padded to ceil(M / N)); on Ascend over HCCL's world group, on the CPU over msrun's."""

    def __init__(self):
        super().__init__()
        self.gather = ops.AllGather()

    def construct(self, x):
        return self.gather(x)


class CardExchange(nn.Cell):
    """The card's side of the weights' exchange: each rank's updated range of the matrices'
    concatenation (`own`, ShardLayout.shard elements in the compute dtype, zero-padded) gathered
    on the card, and each matrix Parameter assigned its slice of the whole. The gathered copy
    is one more set of the card's matrices, alive only in the update phase, when no
    activation or gradient is (the backward's peak is higher); the host sends 1/N of the
    weights a step and reads none back."""

    def __init__(self, card, layout: "ShardLayout"):
        super().__init__(auto_prefix=False)
        self.matrices = ParameterTuple(card[i] for i in layout.matrices)
        self.starts = tuple(layout.offsets[i] for i in layout.matrices)
        self.stops = tuple(layout.offsets[i] + layout.sizes[i] for i in layout.matrices)
        self.shapes = tuple(tuple(card[i].shape) for i in layout.matrices)
        self.gather = ops.AllGather()

    def construct(self, own):
        every = self.gather(own)
        done = ()
        for i in range(len(self.starts)):
            done = done + (ops.assign(self.matrices[i], every[self.starts[i]:self.stops[i]].reshape(self.shapes[i])),)
        return ops.depend(every[0:1], done)


class ShardLayout:
    """Rank `rank` of `ranks`: the (parameter index, start, stop) ranges of the flattened
    parameters its host owns, in the parameters' order: its range of the matrices'
    concatenation, and every vector whole."""

    def __init__(self, params, rank: int, ranks: int):
        self.rank, self.ranks = rank, ranks
        self.sizes = [int(np.prod(p.shape)) for p in params]
        self.matrices = [i for i, p in enumerate(params) if is_matrix(p)]
        self.offsets, total = {}, 0
        for i in self.matrices:
            self.offsets[i], total = total, total + self.sizes[i]
        self.total = total
        self.shard = -(-total // ranks)
        low, high = self.bounds(rank)
        pieces = [(i, max(low, o) - o, min(high, o + self.sizes[i]) - o) for i, o in self.offsets.items()
                  if max(low, o) < min(high, o + self.sizes[i])]
        pieces += [(i, 0, self.sizes[i]) for i, p in enumerate(params) if not is_matrix(p)]
        self.pieces = sorted(pieces)  # the parameters' order: the in-graph step sums the norm in it
        self._gather = _AllGather() if ranks > 1 else None

    def bounds(self, rank: int) -> tuple[int, int]:
        return min(self.total, rank * self.shard), min(self.total, (rank + 1) * self.shard)

    def whole(self, piece) -> bool:
        index, start, stop = piece
        return start == 0 and stop == self.sizes[index]

    def card_ranges(self) -> tuple:
        """Each parameter's flat (start, stop) this rank keeps, in the card's order; (0, 1) for
        one it keeps none of (a graph output of no element is avoided: the host skips it)."""
        kept = {index: (start, stop) for index, start, stop in self.pieces}
        return tuple(kept.get(index, (0, 1)) for index in range(len(self.sizes)))

    def gather(self, owned: list, deliver: Callable[[int, np.ndarray], None]) -> None:
        """Every rank calls it with its pieces' flat fp32 values (`owned`, torch or numpy, in
        self.pieces' order); `deliver(index, values)` receives each matrix's whole flat fp32
        values as its last range arrives. A collective: every rank must call it."""
        low, high = self.bounds(self.rank)
        mine = [np.asarray(v).reshape(-1) for (i, _, _), v in zip(self.pieces, owned) if i in self.offsets]
        local = np.concatenate(mine) if mine else np.zeros(0, np.float32)
        assert local.size == high - low
        chunk, partial = min(self.shard, CHUNK), {}
        for begin in range(0, self.shard, chunk):
            sent = np.zeros(chunk, np.float32)
            part = local[begin:begin + chunk]
            sent[:part.size] = part
            received = self._gather(Tensor(sent)).asnumpy().reshape(self.ranks, chunk)
            for rank in range(self.ranks):
                start = rank * self.shard + begin
                stop = min(start + chunk, self.bounds(rank)[1])
                if start < stop:
                    self._place(start, received[rank, :stop - start], partial, deliver)

    def _place(self, start: int, values: np.ndarray, partial: dict, deliver) -> None:
        """The concatenated matrices' elements [start, start + len(values)) into the tensors they
        belong to, delivering each tensor once all its elements are in."""
        stop = start + values.size
        for i, offset in self.offsets.items():
            low, high = max(start, offset), min(stop, offset + self.sizes[i])
            if low >= high:
                continue
            buffer, filled = partial.get(i, (None, 0))
            if buffer is None:
                buffer = np.empty(self.sizes[i], np.float32)
            buffer[low - offset:high - offset] = values[low - start:high - start]
            filled += high - low
            if filled == self.sizes[i]:
                partial.pop(i, None)
                deliver(i, buffer)
            else:
                partial[i] = (buffer, filled)

