"""selftest's host_optimizer: the path recipes/llama3_2_3b_zh_full_offload_910a.yaml takes
(strategies.offload, steps/host/step.py) on this device, at selftest's size: O2 with
float16 weights on the card, a dynamic loss scale, 2 accumulated micro-batches, AdamW with
decay and clipping on the host. The recipe's full recompute and chunked cross-entropy
change the forward's graph, not the host's part, and would double the check's compile
time: tests/test_offload.py runs them with the optimizer on the host.

Three steps on one fixed batch, each taken twice from the same state: by the in-graph
optimizer, and on the host after the host's fp32 masters and moments are set to the graph's
and pushed to the card (as tests/test_offload.py does). The loss scale starts at 2^24, so
step 1 overflows float16 in the backward on both sides; the scale falls by 2^12 and steps 2
and 3 update (the second from non-zero moments). After each step the check reads the card's
Parameters back:
- on the overflow step they must be bit-identical to before it and the host's states as
  given (the host update skipped);
- after each update every one must have changed, must equal the host's fp32 master cast to
  its card dtype (float16 matrices, float32 gains) exactly (the push is a cast and a copy),
  and each float16 weight may differ from the graph's master cast to float16 by at most one
  float16 step (where a rounding midpoint lies between the two masters).

The figure: the largest difference between the two sides, as a fraction of the bound that
steps/host/update_bound.py derives from fp32 arithmetic, over every step's loss and every
element of the masters and both moments. From the same weights the two losses are the same
per-token values summed in another order; from the same state the two AdamW steps differ
only by the clip factor (each side sums the squares of the gradients in its own order: the
factors' difference is read off the two reported norms) and by the rounding of each
formula's few fp32 operations (MindSpore's AdamWeightDecay against the host's kernel). So
TOLERANCE is 1: a figure above it is a difference that arithmetic does not explain.
Free-running steps have no such bound: a master one rounding apart can round to the
neighbouring float16 weight and the next float16 forward amplifies it, so each step starts
from the graph's state. On the CPU the figure is 0.39 (the second moments' clip-factor
term, which takes the factors' difference as the norms report it, is the nearest to its
bound; a fourth step reached 0.86); the losses are bit-equal. The host's learning rate
doubled (fault) puts the figure above 1e5; a push that never reaches the card, or an update
on the overflow step, fails the read-back.

The bound assumes both steps compute the same float16 gradients from the same weights (they
do on the CPU). What the CPU run cannot show: whether a card's graph step computes them as
the host micro-step does (the 910A compiles both at O2 for GE, which may fuse the weights'
float16 cast otherwise; a failure then names the tensor), the copies over PCIe (on the CPU
both sides are host memory), and the card's own overflow detection (the 910A's float-status
registers).

It also times the copies the step makes each micro-batch and each step, a 64 MB fp32 tensor
from the device to the host (a graph output read with asnumpy, as the step reads the
gradients) and from the host to the device (a host Tensor fed to a graph, as the pushed
weights are read), and with --speed the host update's share of the step's time.
"""
from __future__ import annotations

import time

import numpy as np

from .parts import MAX, Check, Context, Spec, build, random_batch, train_step

TOLERANCE = 1.0  # a fraction of steps/host/update_bound.py's bound: the module's docstring
# The offload recipe's precision, optimizer and clipping (a test compares them with the
# shipped recipe's); 2^24 / the step's tokens overflows float16 in the backward.
BASE = ("strategies.precision.amp_level=O2", "strategies.precision.dtype=float16",
        "strategies.precision.loss_scale=dynamic", "strategies.precision.loss_scale_init=16777216",
        "strategies.precision.loss_scale_factor=4096", "train.optimizer.name=adamw",
        "train.optimizer.weight_decay=0.1", "train.grad_clip=1.0", "train.global_batch_size=4")
OFFLOAD = (*BASE, "strategies.offload.optimizer=host")
MICRO_BATCHES = 2
STEPS = 3
LR = 1e-3
COPY_ELEMENTS = 16 * 2**20  # 64 MB of fp32: long enough that the copy, not its launch, is timed


def spec(ctx: Context) -> Spec:
    from ..steps.host.kernel_check import INSTALL

    skip = ""
    try:
        import numba  # noqa: F401 -- the host kernel's library (the offload extra)
    except ImportError:
        skip = f"numba is not installed: the host update needs it: {INSTALL}"
    return Spec("host_optimizer", "offload", f"{STEPS} steps of O2 float16, 2 micro-batches, a dynamic loss scale "
                                             f"overflowing on the first, each from the graph's state: the card's "
                                             f"weights read back (unchanged on the overflow step, the host's fp32 "
                                             f"masters cast to float16 after each update), and the losses, masters "
                                             f"and moments against the in-graph optimizer's, largest difference as a "
                                             f"fraction of steps/host/update_bound.py's; the device-to-host and "
                                             f"host-to-device copy bandwidth",
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


def card_weights(host) -> dict:
    """The card's Parameters as the card holds them."""
    return {p.name: p.asnumpy().copy() for p in host.card}


def states(params, moments1, moments2) -> tuple:
    """({name: fp32 numpy} of the masters, first and second moments), moments keyed by the weight."""
    named = lambda ps, prefix: {p.name[len(prefix):]: p.asnumpy().astype(np.float32) for p in ps}  # noqa: E731
    return named(params, ""), named(moments1, "adam_m."), named(moments2, "adam_v.")


def set_host_states(host, given: tuple) -> None:
    """The host's masters and moments set to `given` (states()), pushed to the card."""
    for held, values, prefix in zip((host.masters, host.moments1, host.moments2), given, ("", "adam_m.", "adam_v.")):
        for p in held:
            p.asnumpy()[...] = values[p.name[len(prefix):]]
    host.push()


def skipped(step: int, before: dict, after: dict, given: tuple, kept: tuple) -> list:
    """What is wrong after overflowed step `step`: the card's weights or the host's states moved."""
    moved = [name for name, value in after.items() if value.tobytes() != before[name].tobytes()]
    problems = [f"step {step} overflowed, yet the card's {moved[0]} changed ({len(moved)} tensor(s))"] if moved else []
    if any(not np.array_equal(k[name], g[name]) for k, g in zip(kept, given) for name in g):
        problems.append(f"step {step} overflowed, yet the host's masters or moments changed")
    return problems


def read_back(step: int, before: dict, after: dict, masters: dict, graph_masters: dict) -> list:
    """What is wrong with the card's weights after updating step `step` (1-based): unchanged,
    not the host's masters cast, or a float16 weight more than one step from the graph's."""
    from ..steps.host.update_bound import float16_neighbours

    stale = [name for name, value in after.items() if np.array_equal(value, before[name], equal_nan=True)]
    wrong = [name for name, value in after.items()
             if not np.array_equal(value, masters[name].astype(value.dtype), equal_nan=True)]
    far = [name for name, value in after.items() if value.dtype == np.float16
           and not float16_neighbours(value, graph_masters[name].astype(np.float16)).all()]
    problems = [f"step {step} updated, yet the card's {stale[0]} did not change ({len(stale)} tensor(s))"] if stale \
        else []
    if wrong:
        problems.append(f"after step {step} the card's {wrong[0]} is not the host's fp32 master cast to "
                        f"{after[wrong[0]].dtype} ({len(wrong)} tensor(s))")
    if far:
        problems.append(f"after step {step} the card's {far[0]} is more than one float16 step from the graph's "
                        f"({len(far)} tensor(s))")
    return problems


def excess(given: tuple, graph: tuple, host: tuple, decayed: dict, lr: float, section, rho: float) -> float:
    """The largest |host - graph| of the masters and moments after one update from `given`,
    as a fraction of steps/host/update_bound.py's bound."""
    from ..steps.host.update_bound import adamw_difference_bound

    worst = []
    for name in graph[0]:
        bounds = adamw_difference_bound([s[name] for s in given], [s[name] for s in graph], lr, section,
                                        decayed[name], rho)
        for h, g, bound in zip(host, graph, bounds):
            worst.append(np.max(np.abs(h[name].astype(np.float64) - g[name]) / np.maximum(bound, 1e-45)))
    return float(np.max(worst))  # np.max, not max: a NaN (a broken update) must not compare away


class Lockstep:
    """The same step taken in the graph and, from the graph's state, on the host."""

    def __init__(self, ctx: Context, planned: Spec):
        from ..strategies.precision import LossScaler
        from ..steps.host.step import HostStep
        from ..steps.host.build import host_optimizer

        recipe, net, cell = build(ctx, *planned.recipes[0])
        self.graph = train_step(recipe, net, cell, MICRO_BATCHES)
        recipe, net, cell = build(ctx, *planned.recipes[1])
        self.host = host_optimizer(recipe, net.trainable_params())
        self.step = HostStep(cell, self.host, LossScaler(recipe.strategies.precision), recipe.train.grad_clip,
                             MICRO_BATCHES)
        self.train = recipe.train
        self.decayed = {p.name: len(p.shape) >= 2 for p in self.host.card}

    def graph_states(self) -> tuple:
        return states(self.graph.final.weights, self.graph.optimizer.moments1, self.graph.optimizer.moments2)

    def __call__(self, number: int, batch: list, host_lr: float) -> tuple:
        """(host result, graph result, seconds of the host step, figure, problems) of step `number`."""
        from ..steps.host.update_bound import clip_factor_difference, loss_difference_bound

        given = self.graph_states()
        set_host_states(self.host, given)
        before = card_weights(self.host)
        begin = time.perf_counter()
        got = self.step(batch, lr=host_lr)
        seconds = time.perf_counter() - begin
        want = self.graph(batch, lr=LR)
        most = max(int((labels[:, 1:] != -100).sum()) for _, labels in batch)
        figure = abs(got.loss - want.loss) / loss_difference_bound(want.loss, most, len(batch))
        graph, host = self.graph_states(), states(self.host.masters, self.host.moments1, self.host.moments2)
        after = card_weights(self.host)
        if got.overflow:
            return got, want, seconds, figure, skipped(number, before, after, given, host)
        rho = clip_factor_difference(got.grad_norm, want.grad_norm, self.train.grad_clip)
        figure = float(np.max([figure, excess(given, graph, host, self.decayed, LR, self.train.optimizer, rho)]))
        return got, want, seconds, figure, read_back(number, before, after, host[0], graph[0])


def overflow_problems(host: list, graph: list) -> list:
    """The overflow flags: step 1 only, on both sides."""
    want = [True] + [False] * (STEPS - 1)
    flags = [r.overflow for r in host]
    if flags == want == [r.overflow for r in graph]:
        return []
    return [f"overflow flags: host {flags}, graph {[r.overflow for r in graph]}, expected {want} (loss scale "
            f"2^24 must overflow float16 on step 1 only)"]


def check_host_optimizer(ctx: Context, fault=None) -> Check:
    """`fault`: the host run's learning rate doubled, the graph's kept."""
    planned = spec(ctx)
    if planned.skip:
        return planned.skipped()
    batch = [random_batch(2, 61), random_batch(2, 62)]  # one batch, learnt step by step
    lockstep = Lockstep(ctx, planned)
    steps = [lockstep(number, batch, 2 * LR if fault else LR) for number in range(1, STEPS + 1)]
    host, graph = [s[0] for s in steps], [s[1] for s in steps]
    problems = overflow_problems(host, graph) + [p for s in steps for p in s[4]]
    figure = float(np.max([s[3] for s in steps]))  # np.max: a NaN must not compare away
    copies = copy_bandwidth()
    measured = {"to_device_gbs": copies["to_device"], "to_host_gbs": copies["to_host"]}
    if ctx.speed:  # the update alone, on the accumulators as they are, against a whole step (the compiled ones)
        begin = time.perf_counter()
        lockstep.host.update(1e-12)
        measured["update_share_of_step"] = (time.perf_counter() - begin) / min(s[2] for s in steps[1:])
    ctx.device["host_optimizer"] = measured
    shown = problems[:2] + ([f"{len(problems) - 2} more"] if len(problems) > 2 else [])
    losses = f"host losses {['%.6f' % r.loss for r in host]} vs graph {['%.6f' % r.loss for r in graph]}"
    check = planned.result(not problems and figure <= TOLERANCE, figure, "; ".join(shown + [losses]))
    note = (f"copies {copies['to_host']:.1f} GB/s to the host, {copies['to_device']:.1f} GB/s to the device" +
            (f"; the host update {measured['update_share_of_step']:.0%} of a step" if ctx.speed else ""))
    check.reason = f"{check.reason}; {note}" if check.reason else note
    return check
