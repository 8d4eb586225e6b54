"""How the exam scorer runs an exam's packs: op by op ("eager", PyNative: nothing compiled),
through a graph a padded width ("static"), or through one graph of dynamic shape ("dynamic",
Cell.set_inputs with a None dimension, mindspore/nn/cell.py), and the pack width each way
(shared_prefix.choose_cap): whichever the host's rates below say takes the least time,
compiles included. Ascend runs static graphs only (its 910A default, the O2 graph sink, is
not checked here with dynamic shapes, and op by op is not what a card is for).

The CPU's rates were measured on this 2-core host (2026-12-04, load average under 1) with the
hidden-256, 4-layer backbone of benchmarks/exam_throughput.py, batch 8, 128 to 1024 tokens
wide; the /tmp scripts' figures are in docs/evaluation-and-export.md (Speed). Ascend's are
estimates from the design, not measured (no NPU here): they only decide how far widths merge.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence

from ..loss_loop import bucket_length
from .shared_prefix import Pack, choose_cap

# A static graph's batch: 0.079 s for 8 x 128 tokens (3.8 M multiply-adds a token) to 1.16 s
# for 8 x 1024, fitted as multiply-adds at this rate, an attention pair (every W x W of a
# row, masked or not) weighing PAIR_WEIGHT times its multiply-adds (its scale, mask, softmax
# and casts are memory-bound element by element).
CPU_MACS_PER_SECOND = 50e9
PAIR_WEIGHT = 1.45
# The dynamic-shape graph's batch: 1.5-1.85x the static one's at 128-1024 tokens.
DYNAMIC_SLOWDOWN = 1.6
# Op by op (with pynative_synchronize, run_mode): tokens 1.4x, pairs 3.3x the static graph's,
# plus about 7.5 ms a layer a batch of dispatch, and 0.13 s more for a process's first batch.
EAGER_TOKEN_SLOWDOWN, EAGER_PAIR_SLOWDOWN = 1.4, 3.3
EAGER_BATCH_SECONDS_PER_LAYER = 0.0075
EAGER_FIRST_SECONDS = 0.13
# A graph's first run at a shape costs more than its others, growing with its attention's
# pairs: 0.75 / 1.5 / 7.8 s more at 8 x 256 / 512 / 1024 tokens (about a microsecond a pair).
FIRST_RUN_SECONDS_PER_PAIR = 1e-6
# A backbone graph compiles in 1.20 / 1.62 / 2.54 s at 2 / 4 / 8 layers, a second width as
# long; the dynamic-shape one in 1.15x that; the head in 0.33 s. From the compile cache: about
# a third of that (a warm run's compile, the benchmark's "warm" column).
CPU_COMPILE_SECONDS = (0.75, 0.22)  # + per layer
DYNAMIC_COMPILE_FACTOR = 1.15
HEAD_COMPILE_SECONDS = 0.33
CACHED_FRACTION = 0.35
# Ascend (estimates): a graph compiles in a minute or two there, and fp32 runs at a fraction
# of the 910B's 354 TFLOPS fp16 peak: merging widths is almost always the better choice.
ASCEND_MACS_PER_SECOND = 10e12
ASCEND_COMPILE_SECONDS = 90.0


@dataclass
class Plan:
    mode: str  # "eager", "static" or "dynamic"
    packs: List[Pack]  # longest first
    widths: List[int] = field(default_factory=list)  # static: the padded widths, ascending
    seconds: float = 0.0  # the estimate it was chosen by

    def width(self, longest: int) -> int:
        """The width a batch whose longest pack is `longest` is padded to."""
        return longest if self.mode != "static" else next(w for w in self.widths if w >= longest)


@dataclass(frozen=True)
class Rates:
    """The backbone's costs on one device: multiply-adds a token and an attention pair
    (backbone_costs), the rate they run at, and a graph's compile."""
    token_macs: float
    pair_macs: float
    layers: int
    on_ascend: bool = False

    @property
    def macs_per_second(self) -> float:
        return ASCEND_MACS_PER_SECOND if self.on_ascend else CPU_MACS_PER_SECOND

    @property
    def compile_seconds(self) -> float:
        if self.on_ascend:
            return ASCEND_COMPILE_SECONDS
        base, per_layer = CPU_COMPILE_SECONDS
        return base + per_layer * self.layers

    def first_run_seconds(self, rows: int, width: int) -> float:
        """What a graph's first run at this shape costs more than its others (measured on the
        CPU; not known on Ascend, where it is not a choice)."""
        return 0.0 if self.on_ascend else FIRST_RUN_SECONDS_PER_PAIR * rows * width * width

    def batch_seconds(self, rows: int, width: int, token_factor: float = 1.0, pair_factor: float = 1.0) -> float:
        macs = rows * width * (self.token_macs * token_factor + width * self.pair_macs * PAIR_WEIGHT * pair_factor)
        return macs / self.macs_per_second


def backbone_costs(config) -> tuple:
    """(multiply-adds a token, multiply-adds an attention pair) of the backbone of `config`
    (a LlamaConfig): its projections and MLP, and QK^T and PV across its heads."""
    hidden, layers = config.hidden_size, config.num_layers
    kv = (config.n_kv_heads or config.num_heads) * (hidden // config.num_heads)
    return layers * (hidden * (2 * hidden + 2 * kv) + 3 * hidden * config.intermediate_size), layers * 2 * hidden


def batches_of(packs: Sequence[Pack], batch_size: int) -> List[List[Pack]]:
    return [list(packs[i:i + batch_size]) for i in range(0, len(packs), batch_size)]


def plan_widths(lengths: Sequence[int], batch_size: int, max_len: int, rates: Rates) -> List[int]:
    """The widths the backbone compiles for packs of `lengths`, batched `batch_size` at a
    time, longest first: each batch's bucket_length, with neighbouring buckets merged into the
    wider one wherever the padded batches take less time than another compile (an exact
    search over the buckets)."""
    ordered = sorted(lengths, reverse=True)
    needs = [bucket_length(ordered[i], max_len) for i in range(0, len(ordered), batch_size)]
    buckets = sorted(set(needs))
    count = [needs.count(b) for b in buckets]
    # best[j]: the least cost of buckets[:j], its last group ending at bucket j - 1
    best, cut = [0.0] + [float("inf")] * len(buckets), [0] * (len(buckets) + 1)
    for j in range(1, len(buckets) + 1):
        for i in range(j):
            cost = best[i] + rates.compile_seconds + rates.batch_seconds(batch_size, buckets[j - 1]) * sum(count[i:j])
            if cost < best[j]:
                best[j], cut[j] = cost, i
    widths, j = [], len(buckets)
    while j:
        widths.append(buckets[j - 1])
        j = cut[j]
    return sorted(widths)


def compile_seconds(rates: Rates, backbones: int, dynamic: bool, head: bool, cached: bool) -> float:
    """Compiling `backbones` backbone graphs (and the head's, with `head`), or loading them
    from the compile cache (`cached`)."""
    each = rates.compile_seconds * (DYNAMIC_COMPILE_FACTOR if dynamic else 1.0)
    return (backbones * each + HEAD_COMPILE_SECONDS * head) * (CACHED_FRACTION if cached else 1.0)


def _static(packs: List[Pack], batch_size: int, max_len: int, rates: Rates, widths: Sequence[int],
            cached: bool) -> Plan:
    """Through a graph a width: `widths` already compiled, more where the packs need them."""
    lengths = [len(p) for p in packs]
    wanted = plan_widths(lengths, batch_size, max_len, rates)
    if widths:
        longer = max(lengths, default=0) > widths[-1]
        wanted = sorted(set(widths) | ({w for w in wanted if w > widths[-1]} if longer else set()))
    plan = Plan("static", packs, wanted)
    new = [w for w in wanted if w not in widths]
    plan.seconds = compile_seconds(rates, len(new), False, not widths, cached) + sum(
        rates.first_run_seconds(batch_size, w) for w in new) + sum(
        rates.batch_seconds(batch_size, plan.width(len(b[0]))) for b in batches_of(packs, batch_size))
    return plan


def _dynamic(packs: List[Pack], batch_size: int, rates: Rates, compiled: bool, cached: bool) -> Plan:
    plan = Plan("dynamic", packs)
    first = 0.0 if compiled or not packs else rates.first_run_seconds(batch_size, len(packs[0]))
    plan.seconds = (0.0 if compiled else compile_seconds(rates, 1, True, True, cached)) + first + sum(
        rates.batch_seconds(batch_size, len(b[0]), DYNAMIC_SLOWDOWN, DYNAMIC_SLOWDOWN)
        for b in batches_of(packs, batch_size))
    return plan


def _eager(packs: List[Pack], batch_size: int, rates: Rates) -> Plan:
    plan = Plan("eager", packs)
    plan.seconds = EAGER_FIRST_SECONDS + sum(
        EAGER_BATCH_SECONDS_PER_LAYER * rates.layers + rates.batch_seconds(len(b), len(b[0]), EAGER_TOKEN_SLOWDOWN,
                                                                            EAGER_PAIR_SLOWDOWN)
        for b in batches_of(packs, batch_size))
    return plan


def packed(rows: Sequence[tuple], batch_size: int, max_len: int, rates: Rates, token_factor: float = 1.0,
           pair_factor: float = 1.0) -> List[Pack]:
    """The rows packed at the width that costs least at these relative rates, longest first;
    no pack wider than the bucket the longest row is padded to alone, so that a batch takes
    no more memory than it would without packing (--batch-size sized for the prompts)."""
    widest = bucket_length(max((len(r) for r in rows), default=1), max_len)
    _, packs = choose_cap(rows, batch_size, widest, rates.token_macs * token_factor,
                          rates.pair_macs * PAIR_WEIGHT * pair_factor)
    return sorted(packs, key=len, reverse=True)


def choose(rows: Sequence[tuple], batch_size: int, max_len: int, rates: Rates, may_vary: bool,
           mode: Optional[str] = None, widths: Sequence[int] = (),
           cached: Callable[[Plan], bool] = lambda plan: False, forced: Optional[str] = None) -> Plan:
    """The fastest plan for `rows`, or the `forced` mode's (eval's --execution). `mode`: the
    graphs already compiled are of this mode (a later call: --compare's second model, a
    rolling window), which the plan keeps; `widths`: the static ones. `may_vary`: op by op
    and dynamic shapes are options (the CPU). `cached(plan)`: whether the compile cache holds
    that plan's graphs."""
    packs = packed(rows, batch_size, max_len, rates)
    if mode == "dynamic":
        return _dynamic(packs, batch_size, rates, True, False)
    if mode == "static" or not may_vary or forced == "static":
        return _static(packs, batch_size, max_len, rates, widths, False)
    if forced == "dynamic":
        return _dynamic(packs, batch_size, rates, False, False)
    eager = _eager(packed(rows, batch_size, max_len, rates, EAGER_TOKEN_SLOWDOWN, EAGER_PAIR_SLOWDOWN), batch_size,
                   rates)
    if forced == "eager":
        return eager
    static, dynamic = (_static(packs, batch_size, max_len, rates, widths, False),
                       _dynamic(packs, batch_size, rates, False, False))
    plans = [_static(packs, batch_size, max_len, rates, widths, cached(static)),
             _dynamic(packs, batch_size, rates, False, cached(dynamic)), eager]
    return min(plans, key=lambda plan: plan.seconds)
