"""The checks of `llama-npu selftest` (selftest/run.py runs them): each Ascend-only path at
tiny scale, with a reference computed in the same run, so a user with a card proves (or
refutes) it in minutes and attaches the JSON to a bug report.

One function a check: `check_x(ctx, fault=None) -> Check`. `fault` breaks the check's own
subject on purpose (tests/test_selftest.py runs each CPU check with it and sees it fail);
it is never set from the command line. A check that cannot run on this device is a skip
with the reason, never a pass.
"""
from __future__ import annotations

import hashlib
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np

from ..checkpoints.files import load_checkpoint, optimizer_state_params, save_checkpoint
from ..common.collective import all_reduce_sum
from ..data.packing import pack
from ..data.samples import Sample, pad_batch
from ..memory.devices import get_device
from ..memory.planner import estimate, strategy_from_recipe
from ..model.architecture import resolve_shape
from ..model.llama import build_model, llama_config
from ..model.tokens import IGNORE_ID, PAD_ID
from ..recipe.load import load_recipe
from ..weights.convert import ms_to_hf
from ..weights.tensor_files import read_safetensors, rename
from .parts import (FAIL, PASS, REPO, SEQ, SKIP, Check, Context, build, judged, random_batch, train_step, trained_once,
                    weights)

# FACTS.md's device table (public figures; the 910B's is an estimate).
PEAK_FP16_FLOPS = {"910a": 256e12, "910b": 354e12}
FP16 = ("strategies.precision.amp_level=O2", "strategies.precision.dtype=float16")


# ---- overflow ------------------------------------------------------------------------------

def check_overflow_skips_update(ctx: Context, fault=None) -> Check:
    """A loss scale that must overflow fp16 (2^40 / 64 tokens): the update is skipped, the
    weights stay bit-identical and the dynamic scale halves. `fault`: a scale that does not
    overflow, so the weights move."""
    from ..training.step import overflow_check  # imported here: MindSpore loads after run_selftest's quiet_frameworks

    scale = 1.0 if fault else 2.0 ** 40
    recipe, net, cell = build(ctx, *FP16, "strategies.precision.loss_scale=dynamic",
                              f"strategies.precision.loss_scale_init={scale}", "strategies.precision.loss_scale_factor=2")
    step = train_step(recipe, net, cell)
    ctx.device["overflow_mode"] = overflow_check(step.final)
    before = weights(net)
    result = step([random_batch(2, 5)], lr=1e-2)
    changed = sum(int(not np.array_equal(w, before[n])) for n, w in weights(net).items())
    halved = step.loss_scale_state()["scale"] == scale / 2
    ok = result.overflow and changed == 0 and halved
    return Check("overflow_skips_update", "overflow", PASS if ok else FAIL, float(changed), 0.0,
                 "" if ok else f"overflow {result.overflow}, {changed} weights changed, "
                               f"scale {step.loss_scale_state()['scale']:g} (expected {scale / 2:g})")


def check_saturation_registers(ctx: Context, fault=None) -> Check:
    """910A: fp16 saturates (no inf); only the float-status registers see it. A product of
    two large finite fp16 values saturates, and the step must still report the overflow."""
    name = "overflow_saturation_registers"
    if ctx.soc != "910a":
        return Check(name, "overflow", SKIP, reason=f"saturation mode is the 910A's; this is {ctx.soc}")
    # On the 910A every fp16 overflow saturates to a finite value, so the forced overflow is
    # caught only if the registers work (accumulation.py's REGISTERS path,
    # mindspore/nn/wrap/loss_scale.py NPUGetFloatStatusV2).
    inner = check_overflow_skips_update(ctx, fault)
    return Check(name, "overflow", inner.status, inner.figure, inner.tolerance, inner.reason)


# ---- precision -----------------------------------------------------------------------------

def three_steps(ctx: Context, *overrides, lr: float = 1e-3):
    recipe, net, cell = build(ctx, "train.optimizer.name=sgd", *overrides)
    step = train_step(recipe, net, cell)
    results = [step([random_batch(2, seed)], lr=lr) for seed in (11, 12, 13)]
    return [r.loss for r in results], [r.grad_norm for r in results]


def _precision(ctx: Context, name: str, dtype: str, fault) -> Check:
    """Losses and gradient norms of 3 SGD steps in `dtype` (O2, static loss scale 1024)
    against fp32 O0 on the same model and data. `fault`: the half run at 10^5 x the rate."""
    ref_losses, ref_norms = three_steps(ctx)
    losses, norms = three_steps(ctx, "strategies.precision.amp_level=O2", f"strategies.precision.dtype={dtype}",
                                "strategies.precision.loss_scale=static:1024", lr=100.0 if fault else 1e-3)
    diff = max([abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)] +
               [abs(a - b) / abs(b) for a, b in zip(norms, ref_norms)])
    return judged(name, "precision", diff, 2e-2 if dtype == "float16" else 5e-2,
                  f"{dtype} losses {['%.4f' % v for v in losses]} vs fp32 {['%.4f' % v for v in ref_losses]}")


def check_precision_fp16(ctx: Context, fault=None) -> Check:
    return _precision(ctx, "precision_fp16_vs_fp32", "float16", fault)


def check_precision_bf16(ctx: Context, fault=None) -> Check:
    if not ctx.bf16:
        return Check("precision_bf16_vs_fp32", "precision", SKIP,
                     reason="no BF16 kernels on the 910A" if ctx.soc == "910a" else "no BF16 kernels on the CPU backend")
    return _precision(ctx, "precision_bf16_vs_fp32", "bfloat16", fault)


# ---- mask ----------------------------------------------------------------------------------

def packed_samples():
    rng = np.random.default_rng(3)
    return [Sample(list(ids), [IGNORE_ID] + list(ids[1:]), None)
            for ids in (rng.integers(0, 128000, n) for n in (9, 12, 6, 5))]


def per_sample_difference(loss_of, mask: bool) -> float:
    """Max relative difference between each sample's summed loss in a packed row and alone.
    `loss_of(ids, labels[, segments])` -> summed loss. `mask=False` drops the segment ids."""
    import mindspore as ms  # imported here: MindSpore loads after run_selftest's quiet_frameworks

    samples = packed_samples()
    alone = [loss_of(*map(ms.Tensor, pad_batch([s], SEQ + 1, PAD_ID))) for s in samples]
    worst, placed = 0.0, 0
    for row in pack(samples, SEQ + 1):
        ids, labels, segments = pad_batch([row], SEQ + 1, PAD_ID)
        for segment in range(1, int(segments.max()) + 1):
            only = np.where(segments == segment, labels, IGNORE_ID).astype(np.int32)
            inputs = (ids, only, segments) if mask else (ids, only)
            got = loss_of(*map(ms.Tensor, inputs))
            want = alone[placed]
            placed += 1
            worst = max(worst, abs(got - want) / abs(want))
    return worst


def check_mask_packed(ctx: Context, fault=None) -> Check:
    """Packed rows' per-sample losses equal the samples alone, on the attention path this
    device uses (flash attention's uint8 mask, or the additive mask without it).
    `fault`: the rows without their segment ids, so samples see each other."""
    _, _, cell = build(ctx)
    path = "flash attention" if ctx.flash_attention else "additive mask"
    diff = per_sample_difference(lambda *x: float(cell(*x).asnumpy()), mask=not fault)
    return judged(f"mask_packed ({path})", "mask", diff, 1e-4, "packed samples' losses differ from alone")


def check_mask_packed_sharded_loss(ctx: Context, fault=None) -> Check:
    """The same for the sharded layouts' loss (training/sharded_step.py TrainLoss), in
    stand-alone mode: its own mask and head, no sharding needed to check them."""
    # imported here: MindSpore loads after run_selftest's quiet_frameworks
    from ..training.sharded_step import TrainLoss

    import mindspore as ms

    recipe = ctx.recipe()
    ms.set_seed(0)
    net = build_model(llama_config(resolve_shape(recipe.model), SEQ, ctx.target == "ascend",
                                   device_name=recipe.device.name, calculate_per_token_loss=True))
    net.set_train(True)
    loss = TrainLoss(net, 1, SEQ)
    diff = per_sample_difference(lambda *x: float(loss(*x)[0].asnumpy()), mask=not fault)
    return judged("mask_packed_sharded_loss", "mask", diff, 1e-4, "packed samples' losses differ from alone")


def check_mask_flash_vs_plain(ctx: Context, fault=None) -> Check:
    name = "mask_flash_vs_plain"
    if not ctx.flash_attention:
        return Check(name, "mask", SKIP, reason=f"no flash attention on {ctx.soc} (CANN: Atlas A2/A3 only)")
    import mindspore as ms  # imported here: MindSpore loads after run_selftest's quiet_frameworks

    from ..strategies.network import build_network

    recipe = ctx.recipe()
    ids, labels = random_batch(2, 21)
    losses = []
    for flash in (True, False):
        ms.set_seed(0)
        net, cell = build_network(recipe, on_ascend=True) if flash else _plain_network(recipe)
        losses.append(float(cell(ms.Tensor(ids), ms.Tensor(labels)).asnumpy()))
    return judged(name, "mask", abs(losses[0] - losses[1]) / abs(losses[1]), 1e-3,
                  f"flash {losses[0]:.5f} vs plain {losses[1]:.5f}")


def _plain_network(recipe):
    from ..model.loss import CausalLMLoss  # imported here: MindSpore loads after run_selftest's quiet_frameworks

    config = llama_config(resolve_shape(recipe.model), recipe.data.max_seq_len, True, device_name=recipe.device.name)
    config.use_flash_attention = False
    net = build_model(config)
    cell = CausalLMLoss(net)
    cell.set_train(True)
    return net, cell


# ---- memory and speed ----------------------------------------------------------------------

def check_memory_vs_plan(ctx: Context, fault=None) -> Check:
    """max_memory_allocated of one step (after reset_peak_memory_stats) against the
    planner, for two small configurations; fail beyond +-15%."""
    name = "memory_vs_plan"
    if ctx.target != "ascend":
        return Check(name, "memory", SKIP, reason="MindSpore's memory statistics are 0 on the CPU backend, and host "
                                                  "RSS is no proxy for device memory (docs/memory.md)")
    import mindspore as ms  # imported here: MindSpore loads after run_selftest's quiet_frameworks

    worst = 0.0
    for overrides in ((*FP16, "strategies.precision.loss_scale=dynamic"),
                      (*FP16, "strategies.precision.loss_scale=dynamic", "strategies.recompute.mode=full")):
        recipe, net, cell = build(ctx, *overrides)
        step = train_step(recipe, net, cell)
        step([random_batch(2, 1)], lr=1e-3)  # compile
        ms.runtime.reset_peak_memory_stats()
        step([random_batch(2, 2)], lr=1e-3)
        measured = ms.runtime.max_memory_allocated()
        plan = estimate(resolve_shape(recipe.model), sum(p.size for p in net.trainable_params()),
                        get_device(recipe.device.name), strategy_from_recipe(recipe, recipe.device.name))
        planned = plan.total_bytes - plan.components["margin"]
        worst = max(worst, abs(measured / planned - 1))
    return judged(name, "memory", worst, 0.15, "measured peak beyond 15% of the plan")


def speed_figures(ctx: Context) -> dict:
    """A 1B model at the shipped recipe's settings for this SoC, built once a run and timed
    over 3 steps: one micro-batch of the recipe's rows a step, then (rows >= 2) the same rows
    as that many accumulated micro-batches of 1 through a second step on the same network
    and optimizer."""
    if ctx.speed_run is not None:
        return ctx.speed_run
    from ..strategies.network import build_network  # imported here: it loads MindSpore, after quiet_frameworks

    path = REPO / "recipes" / f"llama3_2_1b_zh_full_{'910a' if ctx.soc == '910a' else '910b'}.yaml"
    recipe = load_recipe(path)
    net, cell = build_network(recipe, on_ascend=True)
    rows = recipe.train.micro_batch_size
    ids = np.random.default_rng(0).integers(0, 128000, (rows, recipe.data.max_seq_len + 1)).astype(np.int32)

    def seconds_a_step(step, micro_batches) -> float:
        step(micro_batches, lr=1e-5)  # compile
        begin = time.perf_counter()
        for _ in range(3):
            step(micro_batches, lr=1e-5)
        return (time.perf_counter() - begin) / 3

    one = train_step(recipe, net, cell)
    ctx.speed_run = {"recipe": path.name, "rows": rows, "tokens": rows * recipe.data.max_seq_len,
                     "params": sum(p.size for p in net.trainable_params()), "one": seconds_a_step(one, [(ids, ids)])}
    if rows >= 2:
        accumulating = train_step(recipe, net, cell, k=rows, optimizer=one.optimizer)
        ctx.speed_run["accumulated"] = seconds_a_step(accumulating, [(ids[i:i + 1], ids[i:i + 1]) for i in range(rows)])
    return ctx.speed_run


def _speed_skip(ctx: Context, name: str, on_cpu: str = "") -> Optional[Check]:
    if not ctx.speed:
        return Check(name, "speed", SKIP, reason="pass --speed (builds the 1B model: a few minutes)")
    if ctx.target != "ascend":
        return Check(name, "speed", SKIP, reason="a 1B step at 2,048 tokens takes minutes on a CPU; run it on a card"
                                                 + on_cpu)
    return None


def check_speed(ctx: Context, fault=None) -> Check:
    """Tokens/s and MFU of a 1B step at the shipped recipe's settings for this SoC."""
    name = "speed_1b_mfu"
    if (skip := _speed_skip(ctx, name)) is not None:
        return skip
    run = speed_figures(ctx)
    tokens_per_s = run["tokens"] / run["one"]
    peak = PEAK_FP16_FLOPS.get(ctx.soc, 0.0)
    mfu = 6 * run["params"] * tokens_per_s / peak if peak else float("nan")
    return Check(name, "speed", PASS, mfu, 1.0, f"{tokens_per_s:,.0f} tokens/s, MFU {mfu:.1%} of {peak / 1e12:.0f} "
                                               f"TFLOPS ({run['recipe']}, recompute as the recipe)")


def check_speed_accumulation(ctx: Context, fault=None) -> Check:
    """The time of the recipe's micro-batch split into accumulated micro-batches of 1, against
    it as one micro-batch: the accumulation overhead at a real size, where the CPU backend's
    own cost of splitting (benchmarks/grad_accum_overhead.py) does not decide it. Fails above
    1.05."""
    name = "speed_accumulation_overhead"
    if (skip := _speed_skip(ctx, name, " (on the CPU: benchmarks/grad_accum_overhead.py)")) is not None:
        return skip
    run = speed_figures(ctx)
    if "accumulated" not in run:
        return Check(name, "speed", SKIP, reason=f"{run['recipe']} steps micro-batches of 1 row: none to split, and "
                                                 f"a larger batch to compare against may not fit this card")
    ratio = run["accumulated"] / run["one"]
    return judged(name, "speed", ratio, 1.05, f"{run['rows']} micro-batches of 1 take {ratio:.3f} x one of "
                                              f"{run['rows']} rows ({run['recipe']})")


# ---- parallel ------------------------------------------------------------------------------

def check_data_parallel(ctx: Context, fault=None) -> Check:
    """Under msrun: 3 data-parallel steps leave every rank's weights identical (SHA-256 over
    all ranks) and equal to one process stepping the global batch (its reference, computed
    first on every rank). Each rank takes its 2 rows of the first step as one micro-batch and
    those of the other two as 2 accumulated micro-batches of 1, as the shipped 8 x 910A recipe
    does: both forms of our step's all-reduce are proven. `fault`: rank 0 sees a different batch."""
    name = "data_parallel_equals_one_process"
    if ctx.workers < 2:
        return Check(name, "parallel", SKIP, reason="needs msrun: scripts/launch.sh --selftest 2")
    import mindspore as ms  # imported here, as in every check: MindSpore loads after run_selftest's quiet_frameworks
    from mindspore.communication import get_rank

    batches = [random_batch(2 * ctx.workers, seed) for seed in (31, 32, 33)]
    recipe, net, cell = build(ctx, "train.optimizer.name=sgd")
    step = train_step(recipe, net, cell)
    for b in batches:
        step([b], lr=0.05)
    reference = weights(net)
    ms.set_auto_parallel_context(parallel_mode="data_parallel", gradients_mean=False)
    try:
        rank = get_rank()
        recipe, net, cell = build(ctx, "train.optimizer.name=sgd")
        one = train_step(recipe, net, cell)
        accumulating = train_step(recipe, net, cell, k=2, optimizer=one.optimizer)
        for n, (ids, labels) in enumerate(batches):
            ids, labels = (random_batch(2, 99) if fault and rank == 0 else
                           (ids[2 * rank:2 * rank + 2], labels[2 * rank:2 * rank + 2]))
            if n == 0:
                one([(ids, labels)], lr=0.05)
            else:
                accumulating([(ids[:1], labels[:1]), (ids[1:], labels[1:])], lr=0.05)
        trained = weights(net)
    finally:
        ms.reset_auto_parallel_context()
    digest = hashlib.sha256(b"".join(trained[n].tobytes() for n in sorted(trained))).digest()
    # The bytes d_r agree on every rank iff N * sum(d_r^2) == (sum d_r)^2 (Cauchy-Schwarz),
    # byte by byte: one summing all-reduce, which is all the CPU backend has.
    mine = np.frombuffer(digest, np.uint8).astype(np.float64)
    sums = all_reduce_sum(np.concatenate([mine, mine ** 2])).astype(np.float64)
    total, squares = np.split(sums, 2)
    same = bool((ctx.workers * squares == total ** 2).all())
    diff = max(float(np.abs(trained[n] - reference[n]).max() / (np.abs(reference[n]).max() + 1e-30))
               for n in reference)
    check = judged(name, "parallel", diff, 1e-5, f"weights differ from one process by {diff:.2g}")
    if not same:
        return Check(name, "parallel", FAIL, diff, 1e-5, "the ranks' weight hashes differ")
    return check


def check_resume_exact(ctx: Context, fault=None) -> Check:
    """1 step (trained_once's), checkpoint, 2 more, against a fresh network and optimizer
    loaded from the checkpoint taking the same 2 steps: bit-identical weights. `fault`: the
    optimizer's state is not restored (AdamW's moments start from zero)."""
    from mindspore import Tensor  # imported here: MindSpore loads after run_selftest's quiet_frameworks

    batches = [[random_batch(2, seed)] for seed in (42, 43)]
    with tempfile.TemporaryDirectory(prefix="llama-npu-selftest-") as tmp:
        recipe, net, step = trained_once(ctx)
        path = save_checkpoint(Path(tmp), 1, net.trainable_params(),
                               optimizer_state_params(step.optimizer, net.trainable_params()), {})
        for b in batches:
            step(b, lr=1e-3)
        whole = weights(net)
        recipe, net, cell = build(ctx, "train.seed=7")
        resumed = train_step(recipe, net, cell)
        load_checkpoint(path, net, resumed.optimizer)
        if fault:
            for p in optimizer_state_params(resumed.optimizer, net.trainable_params()):
                if p.name.startswith("adam_"):
                    p.set_data(Tensor(np.zeros(p.shape, np.float32)))
        for b in batches:
            resumed(b, lr=1e-3)
        differing = sum(int(not np.array_equal(w, whole[n])) for n, w in weights(net).items())
    ok = differing == 0
    return Check("resume_exact", "parallel", PASS if ok else FAIL, float(differing), 0.0,
                 "" if ok else f"{differing} tensors differ after resuming")


# ---- export --------------------------------------------------------------------------------

def check_export_exact(ctx: Context, fault=None) -> Check:
    """Train a step, save it as a run does, ms-to-hf, read the safetensors back: the trained
    weights bit-exactly. `fault`: export in float16."""

    recipe, net, _ = trained_once(ctx)
    params = net.trainable_params()
    description = {"format": "llama-npu", "shape": resolve_shape(recipe.model).__dict__,
                   "dtype": str(params[0].dtype).lower(), "source": "selftest", "hf_config": None}
    with tempfile.TemporaryDirectory(prefix="llama-npu-selftest-") as tmp:
        step_dir = save_checkpoint(Path(tmp) / "checkpoints", 1, params, [], {}, description)
        out = ms_to_hf(step_dir, Path(tmp) / "hf", dtype="float16" if fault else "float32")
        exported = read_safetensors(out / "model.safetensors")
        trained = weights(net)
        differing = sum(int(not np.array_equal(np.asarray(values, np.float32), trained[rename(name, to_ms=True)]))
                        for name, (_, values) in exported.items())
    ok = differing == 0 and len(exported) == len(trained)
    return Check("export_ms_to_hf_exact", "export", PASS if ok else FAIL, float(differing), 0.0,
                 "" if ok else f"{differing} of {len(exported)} exported tensors differ from the trained weights")
