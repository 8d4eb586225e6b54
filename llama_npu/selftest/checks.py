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
from pathlib import Path

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
from ..strategies.accumulation import accumulation_steps
from ..strategies.precision import model_dtypes
from ..weights.convert import ms_to_hf
from ..weights.tensor_files import read_safetensors, rename
from .jit import jit_level_and_backend
from .parts import MAX, SEQ, TRAINED_ONCE, Check, Context, Spec, build, random_batch, train_step, trained_once, weights

FP16 = ("strategies.precision.amp_level=O2", "strategies.precision.dtype=float16")


# ---- overflow ------------------------------------------------------------------------------

def overflow_overrides(scale: float) -> tuple:
    return (*FP16, "strategies.precision.loss_scale=dynamic", f"strategies.precision.loss_scale_init={scale}",
            "strategies.precision.loss_scale_factor=2")


def overflow_spec(ctx: Context) -> Spec:
    return Spec("overflow_skips_update", "overflow", "weights changed by a step whose loss scale (2^40 over 64 "
                                                     "tokens) must overflow fp16; the dynamic scale must halve",
                0.0, MAX, recipes=(overflow_overrides(2.0 ** 40),))


def check_overflow_skips_update(ctx: Context, fault=None) -> Check:
    """A loss scale that must overflow fp16 (2^40 / 64 tokens): the update is skipped, the
    weights stay bit-identical and the dynamic scale halves. `fault`: a scale that does not
    overflow, so the weights move."""
    # imported here: MindSpore loads after run_selftest's quiet_frameworks
    import mindspore as ms

    from ..steps.graph_step import overflow_check

    planned = overflow_spec(ctx)
    scale = 1.0 if fault else 2.0 ** 40
    recipe, net, cell = build(ctx, *(overflow_overrides(scale) if fault else planned.recipes[0]))
    step = train_step(recipe, net, cell)
    ctx.device["overflow_mode"] = overflow_check(step.final)
    # What the train step compiles at: its cell's own jit config, if the step sets one, decides.
    ctx.device.update(jit_level_and_backend(ctx.target, ctx.soc, step.final.jit_config_dict,
                                            ms.context.get_jit_config()))
    before = weights(net)
    result = step([random_batch(2, 5)], lr=1e-2)
    changed = sum(int(not np.array_equal(w, before[n])) for n, w in weights(net).items())
    halved = step.loss_scale_state()["scale"] == scale / 2
    return planned.result(result.overflow and changed == 0 and halved, float(changed),
                          f"overflow {result.overflow}, {changed} weights changed, "
                          f"scale {step.loss_scale_state()['scale']:g} (expected {scale / 2:g})")


# ---- precision -----------------------------------------------------------------------------

def three_steps(ctx: Context, overrides: tuple, lr: float = 1e-3):
    recipe, net, cell = build(ctx, *overrides)
    step = train_step(recipe, net, cell)
    results = [step([random_batch(2, seed)], lr=lr) for seed in (11, 12, 13)]
    return [r.loss for r in results], [r.grad_norm for r in results]


def precision_spec(ctx: Context, dtype: str) -> Spec:
    """3 SGD steps at O2 `dtype` against fp32 O0. float16 with a static loss scale of 1024;
    bfloat16 without one (fp32's exponent range: strategies/precision.py refuses a scale)."""
    loss_scale = "static:1024" if dtype == "float16" else "none"
    half = ("train.optimizer.name=sgd", "strategies.precision.amp_level=O2", f"strategies.precision.dtype={dtype}",
            f"strategies.precision.loss_scale={loss_scale}")
    skip = ""
    if dtype == "bfloat16" and not ctx.bf16:
        skip = "no BF16 kernels on the 910A" if ctx.soc == "910a" else "no BF16 kernels on the CPU backend"
    short = "fp16" if dtype == "float16" else "bf16"
    return Spec(f"precision_{short}_vs_fp32", "precision",
                f"losses and gradient norms of 3 SGD steps at O2 {dtype} (loss scale {loss_scale}) against fp32 O0, "
                f"largest relative difference", 2e-2 if dtype == "float16" else 5e-2, MAX,
                recipes=(("train.optimizer.name=sgd",), half), skip=skip)


def _precision(ctx: Context, dtype: str, fault) -> Check:
    """`fault`: the half run at 10^5 x the rate."""
    planned = precision_spec(ctx, dtype)
    if planned.skip:
        return planned.skipped()
    reference, half = planned.recipes
    ref_losses, ref_norms = three_steps(ctx, reference)
    losses, norms = three_steps(ctx, half, lr=100.0 if fault else 1e-3)
    diff = max([abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)] +
               [abs(a - b) / abs(b) for a, b in zip(norms, ref_norms)])
    return planned.judged(diff, f"{dtype} losses {['%.4f' % v for v in losses]} vs fp32 "
                                f"{['%.4f' % v for v in ref_losses]}")


def check_precision_fp16(ctx: Context, fault=None) -> Check:
    return _precision(ctx, "float16", fault)


def check_precision_bf16(ctx: Context, fault=None) -> Check:
    return _precision(ctx, "bfloat16", fault)


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


PER_SAMPLE = "each packed sample's summed loss against the sample alone, largest relative difference"


def compute_dtype(ctx: Context) -> tuple:
    """(overrides, tolerance) of the mask checks at this device's compute dtype, the one its
    shipped recipes train at: fp16 on the 910A, bf16 where the SoC has it, fp32 on the CPU
    (the smoke recipe's O0). The samples' losses agree exactly at fp32 and fp16 on the CPU
    backend (0.0 measured), and packed rows without their mask differ by 3.3e-3 there; 1e-3
    at half precision is an estimate for a card's kernels, not measured on one."""
    if ctx.target != "ascend":
        return (), 1e-4
    dtype = "bfloat16" if ctx.bf16 else "float16"
    return ("strategies.precision.amp_level=O2", f"strategies.precision.dtype={dtype}"), 1e-3


def mask_spec(ctx: Context) -> Spec:
    path = "flash attention" if ctx.flash_attention else "additive mask"
    overrides, tolerance = compute_dtype(ctx)
    return Spec(f"mask_packed ({path})", "mask", PER_SAMPLE + f" at {(overrides or ['fp32'])[-1].split('=')[-1]}",
                tolerance, MAX, recipes=(overrides,))


def check_mask_packed(ctx: Context, fault=None) -> Check:
    """Packed rows' per-sample losses equal the samples alone, on the attention path this
    device uses (flash attention's uint8 mask, or the additive mask without it).
    `fault`: the rows without their segment ids, so samples see each other."""
    planned = mask_spec(ctx)
    _, _, cell = build(ctx, *planned.recipes[0])
    diff = per_sample_difference(lambda *x: float(cell(*x).asnumpy()), mask=not fault)
    return planned.judged(diff, "packed samples' losses differ from alone")


def sharded_loss_spec(ctx: Context) -> Spec:
    overrides, tolerance = compute_dtype(ctx)
    return Spec("mask_packed_sharded_loss", "mask", PER_SAMPLE + f" at {(overrides or ['fp32'])[-1].split('=')[-1]}, "
                                                                 f"through the sharded layouts' TrainLoss",
                tolerance, MAX, recipes=(overrides,))


def check_mask_packed_sharded_loss(ctx: Context, fault=None) -> Check:
    """The same for the sharded layouts' loss (steps/sharded_step.py TrainLoss), in
    stand-alone mode: its own mask and head, no sharding needed to check them."""
    # imported here: MindSpore loads after run_selftest's quiet_frameworks
    from ..steps.sharded_step import TrainLoss

    import mindspore as ms

    planned = sharded_loss_spec(ctx)
    recipe = ctx.recipe(*planned.recipes[0])
    ms.set_seed(0)
    net = build_model(llama_config(resolve_shape(recipe.model), SEQ, ctx.target == "ascend",
                                   device_name=recipe.device.name, calculate_per_token_loss=True,
                                   **model_dtypes(recipe.strategies.precision)))
    net.set_train(True)
    loss = TrainLoss(net, 1, SEQ)
    diff = per_sample_difference(lambda *x: float(loss(*x)[0].asnumpy()), mask=not fault)
    return planned.judged(diff, "packed samples' losses differ from alone")


def flash_spec(ctx: Context) -> Spec:
    return Spec("mask_flash_vs_plain", "mask", "the loss of a batch with flash attention against the plain "
                                               "attention path (relative)", 1e-3, MAX, recipes=((),),
                skip="" if ctx.flash_attention else f"no flash attention on {ctx.soc} (CANN: Atlas A2/A3 only)")


def check_mask_flash_vs_plain(ctx: Context, fault=None) -> Check:
    planned = flash_spec(ctx)
    if planned.skip:
        return planned.skipped()
    import mindspore as ms  # imported here: MindSpore loads after run_selftest's quiet_frameworks

    from ..strategies.network import build_network

    recipe = ctx.recipe(*planned.recipes[0])
    ids, labels = random_batch(2, 21)
    losses = []
    for flash in (True, False):
        ms.set_seed(0)
        net, cell = build_network(recipe, on_ascend=True) if flash else _plain_network(recipe)
        losses.append(float(cell(ms.Tensor(ids), ms.Tensor(labels)).asnumpy()))
    return planned.judged(abs(losses[0] - losses[1]) / abs(losses[1]), f"flash {losses[0]:.5f} vs plain "
                                                                        f"{losses[1]:.5f}")


def _plain_network(recipe):
    from ..model.loss import CausalLMLoss  # imported here: MindSpore loads after run_selftest's quiet_frameworks

    config = llama_config(resolve_shape(recipe.model), recipe.data.max_seq_len, True, device_name=recipe.device.name)
    config.use_flash_attention = False
    net = build_model(config)
    cell = CausalLMLoss(net)
    cell.set_train(True)
    return net, cell


# ---- memory --------------------------------------------------------------------------------

# A size where the decoder, not the 128,256-row embedding, holds most of the memory: 16
# layers of hidden 1024 (252M parameters beside the embedding's 131M) at 2,048 tokens with the
# chunked loss; the planner puts about two thirds of the step's peak in the decoder's weights,
# their states and its activations (15 GB in all on a 910A, 9 GB on a 910B).
DECODER_2048 = ("data.max_seq_len=2048", "train.micro_batch_size=1", "model.hidden_size=1024", "model.num_layers=16",
                "model.num_heads=16", "model.num_kv_heads=8", "model.intermediate_size=4096",
                "strategies.chunked_ce.enabled=true")


def memory_spec(ctx: Context) -> Spec:
    """The cases: the tiny model at k = 1, with full recompute, at k = 2 (2 accumulated
    micro-batches of 2 rows), and DECODER_2048."""
    fp16 = (*FP16, "strategies.precision.loss_scale=dynamic")
    cases = (fp16, (*fp16, "strategies.recompute.mode=full"), (*fp16, "train.global_batch_size=4"),
             (*fp16, *DECODER_2048))
    skip = "" if ctx.target == "ascend" else ("MindSpore's memory statistics are 0 on the CPU backend, and host RSS "
                                              "is no proxy for device memory (docs/memory.md)")
    return Spec("memory_vs_plan", "memory", "max_memory_allocated of one step against the planner's peak (without "
                                            "its margin), largest relative difference over 4 cases: the tiny model "
                                            "at k = 1, with full recompute, at k = 2, and 16 layers of hidden 1024 "
                                            "at 2,048 tokens",
                0.15, MAX, recipes=cases, skip=skip)


def check_memory_vs_plan(ctx: Context, fault=None) -> Check:
    """max_memory_allocated of one step (after reset_peak_memory_stats) against the
    planner, for each case of memory_spec; fail beyond +-15%."""
    planned = memory_spec(ctx)
    if planned.skip:
        return planned.skipped()
    import mindspore as ms  # imported here: MindSpore loads after run_selftest's quiet_frameworks

    worst = 0.0
    figures = []
    for overrides in planned.recipes:
        recipe, net, cell = build(ctx, *overrides)
        k, rows, seq = accumulation_steps(recipe), recipe.train.micro_batch_size, recipe.data.max_seq_len
        step = train_step(recipe, net, cell, k=k)
        step([random_batch(rows, 1 + i, seq) for i in range(k)], lr=1e-3)  # compile
        ms.runtime.reset_peak_memory_stats()
        step([random_batch(rows, 11 + i, seq) for i in range(k)], lr=1e-3)
        measured = ms.runtime.max_memory_allocated()
        plan = estimate(resolve_shape(recipe.model), sum(p.size for p in net.trainable_params()),
                        get_device(recipe.device.name), strategy_from_recipe(recipe, recipe.device.name))
        expected = plan.total_bytes - plan.components["margin"]
        worst = max(worst, abs(measured / expected - 1))
        figures.append(f"k={k} seq={seq} {measured / 2**30:.2f} GiB vs {expected / 2**30:.2f} GiB planned")
    return planned.judged(worst, "measured peak beyond 15% of the plan: " + "; ".join(figures))


# ---- parallel ------------------------------------------------------------------------------

def data_parallel_spec(ctx: Context) -> Spec:
    return Spec("data_parallel_equals_one_process", "parallel",
                "every rank's weights after 3 data-parallel SGD steps (one of 1 micro-batch, two of 2 accumulated) "
                "against one process stepping the global batch, largest relative difference; the ranks' hashes "
                "must agree", 1e-5, MAX, recipes=(("train.optimizer.name=sgd",),),
                skip="" if ctx.workers >= 2 else "needs msrun: scripts/launch.sh --selftest 2")


def check_data_parallel(ctx: Context, fault=None) -> Check:
    """Under msrun: 3 data-parallel steps leave every rank's weights identical (SHA-256 over
    all ranks) and equal to one process stepping the global batch (its reference, computed
    first on every rank). Each rank takes its 2 rows of the first step as one micro-batch and
    those of the other two as 2 accumulated micro-batches of 1, as the shipped 8 x 910A recipe
    does: both forms of our step's all-reduce are proven. `fault`: rank 0 sees a different batch."""
    planned = data_parallel_spec(ctx)
    if planned.skip:
        return planned.skipped()
    import mindspore as ms  # imported here, as in every check: MindSpore loads after run_selftest's quiet_frameworks
    from mindspore.communication import get_rank

    batches = [random_batch(2 * ctx.workers, seed) for seed in (31, 32, 33)]
    recipe, net, cell = build(ctx, *planned.recipes[0])
    step = train_step(recipe, net, cell)
    for b in batches:
        step([b], lr=0.05)
    reference = weights(net)
    ms.set_auto_parallel_context(parallel_mode="data_parallel", gradients_mean=False)
    try:
        rank = get_rank()
        recipe, net, cell = build(ctx, *planned.recipes[0])
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
    if not same:
        return planned.result(False, diff, "the ranks' weight hashes differ")
    return planned.judged(diff, f"weights differ from one process by {diff:.2g}")


def resume_spec(ctx: Context) -> Spec:
    return Spec("resume_exact", "parallel", "tensors differing bit for bit between 2 steps after a resume into a "
                                            "fresh network and the same 2 steps taken without one, plus 1 each time "
                                            "the dynamic loss scale's state (scale, clean steps) differs from the "
                                            "uninterrupted run's (as loaded, after the 2 steps)",
                0.0, MAX, recipes=(TRAINED_ONCE, (*TRAINED_ONCE, "train.seed=7")))


def check_resume_exact(ctx: Context, fault=None) -> Check:
    """1 step (trained_once's), checkpoint as a run does (the loss scale's state in the
    sidecar, training/loop.py), 2 more, against a fresh network and optimizer loaded from the
    checkpoint as a resume does (checkpoints/resume.py) taking the same 2 steps: bit-identical
    weights and the same loss-scale state. `fault`: the optimizer's state is not restored
    (AdamW's moments start from zero); "loss_scale": the loss scale's state is not."""
    from mindspore import Tensor  # imported here: MindSpore loads after run_selftest's quiet_frameworks

    planned = resume_spec(ctx)
    batches = [[random_batch(2, seed)] for seed in (42, 43)]
    with tempfile.TemporaryDirectory(prefix="llama-npu-selftest-") as tmp:
        recipe, net, step = trained_once(ctx)
        path = save_checkpoint(Path(tmp), 1, net.trainable_params(),
                               optimizer_state_params(step.optimizer, net.trainable_params()),
                               {"loss_scale": step.loss_scale_state()})
        for b in batches:
            step(b, lr=1e-3)
        whole, scale = weights(net), step.loss_scale_state()
        recipe, net, cell = build(ctx, *planned.recipes[1])
        resumed = train_step(recipe, net, cell)
        state = load_checkpoint(path, net, resumed.optimizer)
        if fault != "loss_scale":
            resumed.load_loss_scale_state(state["loss_scale"])
        # The state as loaded, then after the same 2 steps, against the uninterrupted run's.
        scales = [(resumed.loss_scale_state(), state["loss_scale"])]
        if fault is True:
            for p in optimizer_state_params(resumed.optimizer, net.trainable_params()):
                if p.name.startswith("adam_"):
                    p.set_data(Tensor(np.zeros(p.shape, np.float32)))
        for b in batches:
            resumed(b, lr=1e-3)
        differing = sum(int(not np.array_equal(w, whole[n])) for n, w in weights(net).items())
        scales.append((resumed.loss_scale_state(), scale))
    wrong = [f"loss scale {got} where the run without a resume had {want}" for got, want in scales if got != want]
    return planned.result(differing + len(wrong) == 0, float(differing + len(wrong)),
                          "; ".join([f"{differing} tensors differ after resuming", *wrong]))


# ---- export --------------------------------------------------------------------------------

def export_spec(ctx: Context) -> Spec:
    return Spec("export_ms_to_hf_exact", "export", "trained tensors differing bit for bit from what ms-to-hf "
                                                   "exported (read back)", 0.0, MAX, recipes=((),))


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
    return export_spec(ctx).result(differing == 0 and len(exported) == len(trained), float(differing),
                                   f"{differing} of {len(exported)} exported tensors differ from the trained weights")
