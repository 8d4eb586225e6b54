"""selftest's checks of the sharded layouts (model / pipeline / optimizer sharding under
semi_auto_parallel) and of their checkpoint export, under `scripts/launch.sh --selftest N`.

On a card each layout is built by setup (training/session.py), exactly as a run builds it,
started from the weights of an unsharded reference computed in the same process, and
stepped 3 times on one fixed batch of packed rows (their segment ids through the sharded
loss's block-causal mask); the model=2, pipeline=2 and optimizer-shard runs are then each
saved as a run saves, merged with merge-checkpoints, exported with ms-to-hf and compared
bit-exactly with their weights as MindSpore gathers them.

The CPU backend cannot compile a semi-auto graph (FACTS.md), so there each check does what
runs without one and reports a skip that says what ran: the layouts are built through
setup under msrun and the reference steps are taken; the export merges per-rank files
that Checkpointer.save wrote from weights cut as model=2 cuts them.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ..checkpoints.files import rank_roots
from ..weights.merge_checkpoints import merge_shards
from ..checkpoints.policy import Checkpointer
from ..common.collective import all_reduce_sum
from ..data.batches import ListSamples
from ..data.packing import pack
from ..data.samples import Sample, pad_batch
from ..model.tokens import IGNORE_ID, PAD_ID
from ..strategies.parallel import World, init_parallel, strategy_file
from ..training.run import open_run_dir
from ..weights.convert import ms_to_hf
from ..weights.tensor_files import read_safetensors, rename
from .parts import MAX, SEQ, SKIP, Check, Context, Spec, build, train_step, trained_once, weights

# Every layout steps the same N-row global batch (N workers): data x micro-batch (x the
# pipeline's micro-batches) = N. AdamW: MindSpore's parallel optimizer refuses SGD
# (mindspore/nn/optim/optimizer.py, _use_parallel_optimizer). grad_clip: MindFormers'
# wrappers compute the global norm only when they clip.
TRAIN = ("train.max_steps=3", "train.optimizer.lr=1e-2", "train.grad_clip=1.0", "train.eval_every=0", "data.pack=true")
LAYOUTS = {
    "model2": ("strategies.parallel.model=2", "train.micro_batch_size=2"),
    "pipeline2": ("strategies.parallel.pipeline=2", "strategies.parallel.micro_batches=2", "train.micro_batch_size=1"),
    "optimizer_shard": ("strategies.parallel.optimizer_shard=true", "train.micro_batch_size=1"),
}
# fp32 compute on both sides: the shards' summation order and Ascend's default fp32 matmul
# mode stay far below this; a wrong split, a missing or doubled reduction moves the loss of a
# batch seen again, or the gradient norm, by far more.
TOLERANCE = 5e-3


def work_dir() -> Path:
    """One directory for every rank of this launch (its scheduler port names it), so that
    rank 0 can merge what every rank saved. Ranks on other nodes see their own /tmp."""
    return Path(tempfile.gettempdir()) / f"llama-npu-selftest-{os.environ.get('MS_SCHED_PORT', os.getpid())}"


def barrier() -> None:
    all_reduce_sum(np.zeros(1))


def relative(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b else abs(a)


def layout_problem(session, section) -> str:
    """What of the asked layout the built run lacks ('' when all is there)."""
    import mindspore as ms  # imported here: MindSpore loads after run_selftest's quiet_frameworks

    from ..steps.sharded_step import ShardedStep

    found = {"sharded": session.world.sharded, "step": type(session.step_fn).__name__,
             "mode": ms.get_auto_parallel_context("parallel_mode"),
             "pipeline": ms.get_auto_parallel_context("pipeline_stages"),
             "optimizer shard": ms.get_auto_parallel_context("enable_parallel_optimizer"),
             "model parallel": session.net.config.parallel_config.model_parallel}
    wanted = {"sharded": True, "step": ShardedStep.__name__, "mode": "semi_auto_parallel",
              "pipeline": section.pipeline, "optimizer shard": section.optimizer_shard,
              "model parallel": section.model}
    return ", ".join(f"{key} {found[key]} (asked {wanted[key]})" for key in wanted if found[key] != wanted[key])


def fresh_work_dir(ctx: Context) -> Path:
    """work_dir(), cleared by rank 0 before any rank writes into it."""
    work = work_dir()
    if ctx.rank == 0:
        shutil.rmtree(work, ignore_errors=True)
    barrier()
    ctx.work = work
    return work


def packed_batch(rows: int, seed: int) -> tuple:
    """(ids, labels, segment ids) of `rows` packed rows of SEQ + 1 tokens, each two samples
    (each sample's first token not a target) that fill it exactly."""
    rng = np.random.default_rng(seed)
    samples = []
    for n in [SEQ + 1 - (SEQ + 1) // 2] * rows + [(SEQ + 1) // 2] * rows:
        ids = rng.integers(0, 128000, n).tolist()
        samples.append(Sample(ids, [IGNORE_ID] + ids[1:], None))
    return pad_batch(pack(samples, SEQ + 1), SEQ + 1, PAD_ID)


def layout_difference(session, layout: str, batch, reference: list) -> tuple[float, str]:
    """(the largest relative difference of the layout's 3 steps from the unsharded
    reference's losses and gradient norms -- the pipeline's: losses only --, what is wrong
    when it exceeds TOLERANCE, else '')."""
    from ..steps.optimizer import lr_at  # imported here: it loads MindSpore, after run_selftest's quiet_frameworks

    ref_losses = [r.loss for r in reference]
    results = [session.step_fn([batch], lr_at(i, session.recipe.train)) for i in (1, 2, 3)]
    diffs = [relative(r.loss, want) for r, want in zip(results, ref_losses)]
    if layout != "pipeline2":
        diffs += [relative(r.grad_norm, want.grad_norm) for r, want in zip(results, reference)]
    diff = max(diffs)
    if diff <= TOLERANCE:
        return diff, ""
    return diff, (f"{layout}: losses {['%.5f' % r.loss for r in results]} vs unsharded "
                  f"{['%.5f' % v for v in ref_losses]}, grad norms "
                  f"{['%.4f' % r.grad_norm for r in results]} vs {['%.4f' % r.grad_norm for r in reference]}")


def what_ran_on_cpu(built: list, workers: int, reference: list) -> str:
    return (f"ran: built {', '.join(built)} through train.setup on {workers} ranks (MindFormers' wrapper chain, "
            f"semi_auto_parallel, the reference's weights loaded) and took the unsharded reference's 3 steps on "
            f"packed rows (losses "
            f"{', '.join('%.4f' % r.loss for r in reference)}); the sharded steps compile a semi_auto_parallel graph, "
            f"which needs Ascend: scripts/launch.sh --selftest N on a card")


def layouts_spec(ctx: Context) -> Spec:
    """The unsharded reference's recipe, then each layout's (validated on a card's device name:
    the CPU cannot compile them)."""
    device = [] if ctx.target == "ascend" else ["device.target=ascend", "device.name=910b"]
    skip = "" if ctx.workers >= 2 and ctx.workers % 2 == 0 else ("needs msrun on an even number of workers: "
                                                                 "scripts/launch.sh --selftest N on Ascend")
    return Spec("sharded_model_pipeline_optimizer", "parallel",
                f"losses and gradient norms (pipeline2: losses) of 3 steps of {', '.join(LAYOUTS)} on packed rows "
                f"(2 samples a row, with their segment ids), each against the unsharded step on the same batch, "
                f"largest relative difference", TOLERANCE, MAX,
                recipes=(TRAIN, *((*TRAIN, *overrides, *device) for overrides in LAYOUTS.values())), skip=skip)


def check_sharded_layouts(ctx: Context, fault=None) -> Check:
    """model=2, pipeline=2 (2 micro-batches) and optimizer_shard=true, each built by
    setup and stepped 3 times on one fixed batch from the reference's initial
    weights: losses and gradient norms (the pipeline: losses only; that the norm a stage
    reports spans every stage is not established) within TOLERANCE of the unsharded
    TrainStep on the same batch, computed first on every rank. The batch is packed rows with
    their segment ids, so the sharded loss's block-causal mask (sharded_step.TrainLoss) runs
    on the card's attention path. On a card: about a minute a layout, mostly compiling (4
    graphs in all)."""
    planned = layouts_spec(ctx)
    if planned.skip:
        return planned.skipped()
    # imported here: they load MindSpore, after run_selftest's quiet_frameworks
    import mindspore as ms

    from ..steps.optimizer import lr_at
    from ..training.session import setup

    batch = packed_batch(ctx.workers, 61)
    recipe, net, cell = build(ctx, *planned.recipes[0])
    initial = weights(net)
    step = train_step(recipe, net, cell)
    reference = [step([batch], lr=lr_at(i, recipe.train)) for i in (1, 2, 3)]
    work = fresh_work_dir(ctx)  # nobody writes into the directory before rank 0 has cleared it
    source = ListSamples([Sample(list(range(1, 35)), list(range(1, 35)))])  # unused: the check feeds its own batch
    worst, problems, built, figures = 0.0, [], [], []
    try:
        for layout, overrides in zip(LAYOUTS, planned.recipes[1:]):
            sharded = ctx.recipe(*overrides)
            run_dir = work / layout
            (run_dir / "strategy").mkdir(parents=True, exist_ok=True)
            if ctx.rank == 0:  # the run's recipe.yaml, which merge-checkpoints reads
                open_run_dir(run_dir, sharded, overwrite=False)
            session = setup(sharded, run_dir, source, [], on_ascend=ctx.target == "ascend")
            problem = layout_problem(session, sharded.strategies.parallel)
            if problem:
                problems.append(f"{layout}: {problem}")
                continue
            built.append(f"{layout} (data {sharded.strategies.parallel.data})")
            # Whole tensors before the first compile, which slices each to this rank's
            # shard (mindspore/parallel/_utils.py _slice_parameter: _load_tensor_by_layout).
            for p in session.params:
                p.set_data(ms.Tensor(initial[p.name]))
            if ctx.target != "ascend":
                continue
            diff, problem = layout_difference(session, layout, batch, reference)
            problems += [problem] if problem else []
            worst = max(worst, diff if diff == diff else float("inf"))
            figures.append(f"{layout} {diff:.2g}")
            ctx.sharded_runs[layout] = session
    finally:
        ms.reset_auto_parallel_context()
    if problems:
        return planned.result(False, worst if ctx.target == "ascend" else None, "; ".join(problems))
    if ctx.target != "ascend":
        return planned.skipped(what_ran_on_cpu(built, ctx.workers, reference))
    check = planned.result(True, worst, "")
    check.reason = f"largest relative difference: {', '.join(figures)}"
    return check


# ---- export --------------------------------------------------------------------------------

def model2_split(name: str) -> list:
    """The tensor map model=2 gives a weight (-1: not split; 0: split over the 2 ranks): the
    column-parallel projections (wq, wk, wv, w1, w3) on their output dimension, the
    row-parallel ones (wo, w2) on their input dimension, everything else replicated
    (mindformers/models/llama/llama_transformer.py and llama_layer.py, their matmul shards
    ((dp, 1), (mp, 1)) and ((dp, mp), (1, mp)))."""
    if re.search(r"\.w(q|k|v|1|3)\.weight$", name):
        return [0, -1]
    if re.search(r"\.w(o|2)\.weight$", name):
        return [-1, 0]
    return None


def write_strategy(path: Path, tensor_maps: dict, stage: int = 0, devices: int = 2) -> None:
    """A strategy file in MindSpore's protobuf format (node_strategy.proto) for pipeline
    stage `stage` of `devices` devices a stage: `tensor_maps` gives each weight's tensor map
    over the device matrix [devices] (-1: not split), as a compiled graph records it."""
    import mindspore as ms  # imported here: MindSpore loads after run_selftest's quiet_frameworks

    strategy = ms.train.node_strategy_pb2.ParallelStrategyMap()
    strategy.current_stage = stage
    node = strategy.parallel_strategy_item.add()
    node.node_name = f"MatMul-op{stage}"
    node.parallel_strategys.stage = stage
    node.parallel_strategys.parallel_strategy.add().dim.extend([1, 1])
    for name, tensor_map in tensor_maps.items():
        item = strategy.parallel_layout_item.add()
        item.param_name = name
        item.parallel_layouts.dev_matrix.add().dim.extend([devices])
        item.parallel_layouts.tensor_map.add().dim.extend(tensor_map)
        item.parallel_layouts.param_split_shape.add()
        item.parallel_layouts.indices_offset.add()
        item.parallel_layouts.field, item.parallel_layouts.opt_weight_shard_step = 0, 0
        item.parallel_layouts.opt_weight_shard_size = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(strategy.SerializeToString())


def rank_slices(trained: dict, rank: int) -> list:
    """Rank `rank`'s Parameters of a model=2 cut, marked `sliced` as a compiled graph marks
    what a rank holds (mindspore/parallel/_utils.py _slice_parameter)."""
    import mindspore as ms  # imported here: MindSpore loads after run_selftest's quiet_frameworks

    params = []
    for name, value in trained.items():
        split = model2_split(name)
        part = np.split(value, 2, axis=split.index(0))[rank] if split else value
        p = ms.Parameter(ms.Tensor(np.ascontiguousarray(part)), name=name)
        p.sliced = True
        params.append(p)
    return params


def exported_difference(run_dir: Path, out: Path, reference: dict) -> tuple:
    """merge-checkpoints of the run's newest step, ms-to-hf, and the safetensors read back:
    (tensors differing from `reference` bit for bit, tensors exported)."""

    merged = merge_shards(run_dir, out / "merged")
    exported = read_safetensors(ms_to_hf(merged, out / "hf", dtype="float32") / "model.safetensors")
    differing = sum(int(not np.array_equal(np.asarray(values, np.float32), reference.get(rename(name, to_ms=True))))
                    for name, (_, values) in exported.items())
    return differing + abs(len(reference) - len(exported)), len(exported)


# The runs of check_sharded_layouts whose per-rank checkpoints the export merges on a card:
# a model cut, a pipeline cut (each rank holds its stage's weights) and an optimizer-shard cut
# (each rank holds a slice of every weight; the strategy file's opt_weight_shard fields
# rebuild them: mindspore/parallel/_parallel_serialization.py).
EXPORTED = ("model2", "pipeline2", "optimizer_shard")


def export_sharded_spec(ctx: Context) -> Spec:
    return Spec("export_merge_sharded", "export", f"tensors differing bit for bit between each of the "
                                                  f"{', '.join(EXPORTED)} runs' shards merged, exported and read "
                                                  f"back, and its weights gathered by MindSpore (elsewhere: 2 "
                                                  f"simulated model=2 shards against the trained weights)",
                0.0, MAX, recipes=((),))


def simulated_export(ctx: Context, fault) -> Check:
    """What a host runs of the sharded export: 2 ranks' shards of one trained step, cut as
    model=2 cuts them and written by Checkpointer.save with that layout's strategy file,
    merged, exported and read back. `fault`: rank 1 saves rank 0's slices."""
    # imported here: MindSpore loads after run_selftest's quiet_frameworks
    from ..steps.optimizer import build_optimizer

    planned = export_sharded_spec(ctx)
    recipe, net, _ = trained_once(ctx)
    trained = weights(net)
    with tempfile.TemporaryDirectory(prefix="llama-npu-selftest-") as tmp:
        run_dir = Path(tmp) / "run"
        open_run_dir(run_dir, recipe, overwrite=False)
        for rank in (0, 1):
            write_strategy(strategy_file(run_dir, rank), {n: model2_split(n) or [-1] * v.ndim for n, v in trained.items()})
            mine = rank_slices(trained, 0 if fault else rank)
            Checkpointer(run_dir, World(rank, 2, sharded=True), keep_last=1).save(
                1, mine, build_optimizer(mine, recipe.train), {"samples_consumed": 2})
        differing, exported = exported_difference(run_dir, Path(tmp), trained)
    if differing:
        return planned.result(False, float(differing), f"{differing} of {exported} tensors merged from 2 ranks' "
                                                       f"shards differ from the trained weights")
    return planned.skipped(figure=float(differing), reason=(
        f"ran: 2 ranks' model=2 shards written by Checkpointer.save, merge-checkpoints and ms-to-hf give all "
        f"{exported} trained tensors bit-exactly; the shards and strategy files of a compiled sharded graph need "
        f"scripts/launch.sh --selftest N on Ascend"))


def check_export_sharded(ctx: Context, fault=None) -> Check:
    """On a card under msrun: each EXPORTED run of check_sharded_layouts saved by train.save
    (each rank its own shards), merged by rank 0, exported and read back, against its weights
    as MindSpore's integrated save gathers them (mindspore/train/serialization.py,
    _get_merged_param_data: an AllGather a sharded weight). Elsewhere: simulated_export."""
    planned = export_sharded_spec(ctx)
    if ctx.target != "ascend":
        if ctx.workers > 1:
            return planned.skipped("on the CPU `llama-npu selftest` merges simulated shards; the files of a "
                                   "compiled sharded graph need Ascend")
        return simulated_export(ctx, fault)
    runs = [layout for layout in EXPORTED if layout in ctx.sharded_runs]
    if ctx.workers < 2 or not runs:
        inner = simulated_export(ctx, fault)
        if inner.status == SKIP and ctx.workers > 1:  # check_sharded_layouts said why there is no run
            inner.reason = "no run of sharded_model_pipeline_optimizer completed; " + inner.reason
        return inner
    found = {layout: exported_run(ctx, ctx.sharded_runs[layout]) for layout in runs}
    if any(elsewhere for _, _, elsewhere, _ in found.values()):
        return planned.skipped("the ranks' checkpoints are not on one filesystem; run scripts/launch.sh --selftest "
                               "N on one node")
    missing = [layout for layout in EXPORTED if layout not in found]
    differing = sum(d for d, _, _, _ in found.values())
    ok = not missing and differing == 0 and all(n > 0 for _, n, _, _ in found.values())
    what = "; ".join(reason or f"{layout}: {d} of {n} exported tensors differ from the gathered weights"
                     for layout, (d, n, _, reason) in found.items())
    check = planned.result(ok, float(differing), what + (f"; {', '.join(missing)} did not complete "
                                                         f"(sharded_model_pipeline_optimizer)" if missing else ""))
    check.reason = check.reason or what
    return check


def exported_run(ctx: Context, session) -> tuple:
    """(tensors differing, tensors exported, 1 if the ranks' files are not all on this
    filesystem, what failed) for one sharded run: saved by every rank as a run saves, and
    its weights as MindSpore's integrated save gathers them; rank 0 merges and exports the
    shards and compares them with the union of the ranks' gathered files (a pipeline rank
    gathers its own stage's weights only)."""
    import mindspore as ms  # imported here: MindSpore loads after run_selftest's quiet_frameworks

    from ..training.loop import save

    rank = session.world.rank
    save(session, 3)
    names = {p.name for p in session.params}
    # The run's layout again (later layouts replaced it), without saving a strategy file: the
    # gather graphs would replace the train graph's, which the merge reads (as
    # sharded_step.EvalKeepingTrainStrategy does for evaluation).
    init_parallel(session.recipe.strategies.parallel, session.run_dir)
    ms.set_auto_parallel_context(strategy_ckpt_config={"save_file": ""})
    try:
        ms.save_checkpoint(session.step_fn.train_network, str(session.run_dir / f"gathered_rank_{rank}.ckpt"),
                           integrated_save=True, choice_func=names.__contains__)
    finally:
        ms.reset_auto_parallel_context()
    session.checkpointer.wait_for_every_rank()
    outcome = np.zeros(3, np.float32)  # [differing, exported, 1 if the ranks' files are not all here]
    reason = ""
    if rank == 0:
        try:
            files = [session.run_dir / f"gathered_rank_{r}.ckpt" for r in range(ctx.workers)]
            if len(rank_roots(session.run_dir)) != ctx.workers or not all(f.exists() for f in files):
                outcome[2] = 1
            else:
                gathered = {}
                for path in files:
                    for name, value in ms.load_checkpoint(str(path)).items():
                        gathered.setdefault(name, value.asnumpy())
                outcome[:2] = exported_difference(session.run_dir, session.run_dir / "export", gathered)
        except Exception as exc:  # every rank must reach the all-reduce below
            outcome[0], reason = -1, f"{type(exc).__name__}: {exc}"[:300]
    differing, exported, elsewhere = (int(v) for v in all_reduce_sum(outcome))
    return differing, exported, elsewhere, reason
