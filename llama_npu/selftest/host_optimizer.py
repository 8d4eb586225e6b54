"""selftest's host_optimizer: the optimizer on the host (strategies.offload, training/host_step.py)
on this device against the in-graph update. Three fp32 AdamW steps with clipping, the same
batches from the same weights: the losses and the final weights (the host's fp32 masters
against the graph's parameters) agree within TOLERANCE. It also times the copies the step
makes each micro-batch and each step, a 64 MB fp32 tensor from the device to the host (a
graph output read with asnumpy, as the step reads the gradients) and from the host to the
device (a host Tensor fed to a graph, as the pushed weights are read), and with --speed the
host update's share of the step's time. On the CPU backend both sides are host memory."""
from __future__ import annotations

import time

import numpy as np

from .parts import MAX, Check, Context, Spec, build, random_batch, train_step, weights

# tests/test_offload.py holds fp32 AdamW on the host to 1e-6 of the graph over 10 CPU steps; a
# card's fp32 reductions (and the 910A's jit level O2) may order sums differently: 1e-5 over 3.
TOLERANCE = 1e-5
BASE = ("train.optimizer.name=adamw", "train.optimizer.weight_decay=0.1", "train.grad_clip=1.0")
OFFLOAD = (*BASE, "strategies.offload.optimizer=host")
COPY_ELEMENTS = 16 * 2**20  # 64 MB of fp32: long enough that the copy, not its launch, is timed
STEPS = 3


def spec(ctx: Context) -> Spec:
    from ..training.host_kernel_check import INSTALL

    skip = ""
    try:
        import numba  # noqa: F401 -- the host kernel's library (the offload extra)
    except ImportError:
        skip = f"numba is not installed: the host update needs it: {INSTALL}"
    return Spec("host_optimizer", "offload", f"losses and weights of {STEPS} fp32 AdamW steps with the optimizer on "
                                             f"the host against in the graph, largest relative difference; the "
                                             f"device-to-host and host-to-device copy bandwidth",
                TOLERANCE, MAX, recipes=(BASE, OFFLOAD), skip=skip)


def copy_bandwidth() -> dict:
    """GB/s (10^9 bytes) each way, the best of three 64 MB copies."""
    import mindspore as ms
    from mindspore import Tensor, nn

    class Add(nn.Cell):
        def construct(self, x):
            return x + 1

    add, host = Add(), np.ones(COPY_ELEMENTS, np.float32)
    add(Tensor(host)).asnumpy()  # compiled
    to_device, to_host = [], []
    for _ in range(3):
        begin = time.perf_counter()
        out = add(Tensor(host))  # the input goes to the device before the kernel runs
        ms.runtime.synchronize()
        middle = time.perf_counter()
        out.asnumpy()
        to_device.append(middle - begin)
        to_host.append(time.perf_counter() - middle)
    return {"to_device": 4 * COPY_ELEMENTS / min(to_device) / 1e9, "to_host": 4 * COPY_ELEMENTS / min(to_host) / 1e9}


def relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def check_host_optimizer(ctx: Context, fault=None) -> Check:
    """`fault`: the host run's learning rate doubled, the graph's kept."""
    from ..training.host_step import HostStep
    from ..training.session import host_optimizer
    from ..strategies.precision import LossScaler

    planned = spec(ctx)
    if planned.skip:
        return planned.skipped()
    batches = [[random_batch(2, seed)] for seed in (61, 62, 63)]
    recipe, net, cell = build(ctx, *planned.recipes[0])
    in_graph = train_step(recipe, net, cell)
    graph_losses = [in_graph(batch, lr=1e-3).loss for batch in batches]
    graph_weights = weights(net)

    recipe, net, cell = build(ctx, *planned.recipes[1])
    host = host_optimizer(recipe, net.trainable_params())
    step = HostStep(cell, host, LossScaler(recipe.strategies.precision), recipe.train.grad_clip)
    lr = 2e-3 if fault else 1e-3
    times, losses = [], []
    for batch in batches:
        begin = time.perf_counter()
        losses.append(step(batch, lr=lr).loss)
        times.append(time.perf_counter() - begin)
    masters = {p.name: p.asnumpy() for p in host.master_params}
    figure = max([abs(a - b) / abs(b) for a, b in zip(losses, graph_losses)] +
                 [relative(masters[name], graph_weights[name]) for name in graph_weights])
    copies = copy_bandwidth()
    measured = {"to_device_gbs": copies["to_device"], "to_host_gbs": copies["to_host"]}
    if ctx.speed:  # the update alone, on the accumulators as they are, against a whole step (the compiled ones)
        begin = time.perf_counter()
        host.update(1e-12)
        measured["update_share_of_step"] = (time.perf_counter() - begin) / min(times[1:])
    ctx.device["host_optimizer"] = measured
    check = planned.judged(figure, f"host losses {['%.6f' % v for v in losses]} vs graph "
                                   f"{['%.6f' % v for v in graph_losses]}")
    note = (f"copies {copies['to_host']:.1f} GB/s to the host, {copies['to_device']:.1f} GB/s to the device" +
            (f"; the host update {measured['update_share_of_step']:.0%} of a step" if ctx.speed else ""))
    check.reason = f"{check.reason}; {note}" if check.reason else note
    return check
