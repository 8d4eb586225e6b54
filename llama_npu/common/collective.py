"""The one collective the host side needs: a float32 array summed over every rank, on
every rank. The checkpointer agrees on a resume step and waits for the ranks with it;
selftest compares weight hashes and shares rank 0's figures with it.
"""
from __future__ import annotations

from contextlib import contextmanager
from functools import cache

import numpy as np


@contextmanager
def stand_alone():
    """Graphs compiled inside are stand-alone, each rank's own whole arrays, also in a
    semi-auto parallel run (where an op without a shard strategy is split along dimension 0,
    and which the CPU backend cannot compile); the run's settings are set again after.
    full_batch goes off with the mode: every Cell compile refuses full_batch outside semi-auto
    and auto parallel (mindspore/graph/api.py calls parallel/_utils.py _check_full_batch), and
    a sharded run sets it (strategies/parallel.py auto_parallel_context). The parallel optimizer
    and the strategy file stay set: MindSpore reads them for semi-auto graphs only."""
    import mindspore as ms  # imported here: selftest imports this module before its quiet_frameworks

    mode, full_batch = ms.get_auto_parallel_context("parallel_mode"), ms.get_auto_parallel_context("full_batch")
    sharded = mode in ("semi_auto_parallel", "auto_parallel")
    if sharded:
        ms.set_auto_parallel_context(parallel_mode="stand_alone", full_batch=False)
    try:
        yield
    finally:
        if sharded:
            ms.set_auto_parallel_context(parallel_mode=mode, full_batch=full_batch)


def all_reduce_sum(values) -> np.ndarray:
    """`values` (float32) summed over every rank; also a barrier. The CPU backend has only a
    summing AllReduce, and only inside a graph, hence the one-op cell; integers below 2**24
    come back exact."""
    import mindspore as ms  # imported here: selftest imports this module before its quiet_frameworks

    with stand_alone():  # one whole array per rank, also in a semi-auto run (not run there: no NPU)
        return _summing_cell()(ms.Tensor(np.asarray(values, np.float32))).asnumpy()


@cache
def _summing_cell():
    """One cell a process, compiled once a shape: KTO's KL estimate sums every step, and a new
    cell is a new graph to compile (MindSpore keys a compiled graph by the cell's create_time
    and id: mindspore/graph/api.py). benchmarks/host_collective.py measures both."""
    from mindspore import nn, ops

    class _Sum(nn.Cell):
        def __init__(self):
            super().__init__()
            self.sum = ops.AllReduce()

        def construct(self, x):
            return self.sum(x)

    return _Sum()
