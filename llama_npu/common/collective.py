"""The one collective the host side needs: a float32 array summed over every rank, on
every rank. The checkpointer agrees on a resume step and waits for the ranks with it;
selftest compares weight hashes and shares rank 0's figures with it.
"""
from __future__ import annotations

import numpy as np


def all_reduce_sum(values) -> np.ndarray:
    """`values` (float32) summed over every rank; also a barrier. The CPU backend has only a
    summing AllReduce, and only inside a graph, hence the one-op cell; integers below 2**24
    come back exact."""
    import mindspore as ms  # imported here: selftest imports this module before its quiet_frameworks
    from mindspore import nn, ops

    class _Sum(nn.Cell):
        def __init__(self):
            super().__init__()
            self.sum = ops.AllReduce()

        def construct(self, x):
            return self.sum(x)

    # Under semi-auto parallel an op without a shard strategy is split along dimension 0;
    # this small graph is compiled outside it, as one whole array per rank (not run: no NPU).
    mode = ms.get_auto_parallel_context("parallel_mode")
    sharded = mode in ("semi_auto_parallel", "auto_parallel")
    if sharded:
        ms.set_auto_parallel_context(parallel_mode="stand_alone")
    try:
        return _Sum()(ms.Tensor(np.asarray(values, np.float32))).asnumpy()
    finally:
        if sharded:
            ms.set_auto_parallel_context(parallel_mode=mode)
