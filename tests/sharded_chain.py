"""Run under msrun by tests/test_parallel.py: each rank builds the train step of several
sharded layouts with train.setup, the function a run builds itself with, and writes what it
built to <out>/rank_<R>.json. Nothing is compiled: semi-auto parallel cannot
compile on the CPU backend, but MindFormers' wrappers build there once communication is up
(MFPipelineWithLossScaleCell creates a communication group in its constructor). The DPO
layout's reference pass does compile and run: stand-alone, before the chain is built
(objectives/dpo/sharded.py). Then the pipeline wrapper's float-status order is dumped as
IR (register_order_ir).

    python tests/sharded_chain.py OUT_DIR
"""
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn

from llama_npu.common.collective import all_reduce_sum
from llama_npu.common.launcher import is_scheduler
from llama_npu.data.batches import ListSamples
from llama_npu.objectives.dpo.source import PairSource
from llama_npu.objectives.dpo.pairs import PairSample
from llama_npu.data.samples import Sample
from llama_npu.recipe.load import load_recipe
from llama_npu.selftest.sharded import layout_problem
from llama_npu.strategies.parallel import run_scheduler
from llama_npu.training.session import setup
from llama_npu.steps.sharded_step import ShardedStep
from test_strategies import FakeSoC, summed_loss  # the register-order test's fake 910A and Dense loss

REPO = Path(__file__).resolve().parent.parent
ASCEND_TINY = ["device.target=ascend", "device.name=910b", "model.preset=tiny", "data.max_seq_len=16",
               "train.micro_batch_size=1", "train.global_batch_size=0", "train.eval_every=0"]
FP16 = ["strategies.precision.amp_level=O2"]  # loss scaling is refused with fp32 compute (O0)
LAYOUTS = {
    "model2": ["strategies.parallel.model=2", "train.grad_clip=0.5", "strategies.precision.loss_scale=static:1024",
               *FP16],
    "model2_accumulate4": ["strategies.parallel.model=2", "train.global_batch_size=4",
                           "strategies.precision.loss_scale=dynamic", "strategies.precision.loss_scale_init=4096",
                           *FP16],
    "pipeline2": ["strategies.parallel.pipeline=2", "strategies.parallel.micro_batches=4", "data.eval_files=",
                  "strategies.precision.loss_scale=dynamic", "strategies.precision.loss_scale_init=256", *FP16],
    "optimizer_shard": ["strategies.parallel.optimizer_shard=true", "train.grad_clip=2.0"],
}


def chain(cell) -> list:
    """Class names from the outermost wrapper down to MindFormers' Llama; a class of ours that
    subclasses MindFormers' (steps/sharded_step.py clearing_before_forward) as OURS(THEIRS)."""
    names = []
    while cell is not None:
        kind, base = type(cell), type(cell).__mro__[1]
        names.append(f"{kind.__name__}({base.__name__})" if base.__module__.startswith("mindformers")
                     and kind.__module__.startswith("llama_npu") else kind.__name__)
        cell = next((getattr(cell, a) for a in ("network", "_backbone", "llama") if hasattr(cell, a)), None)
    return names


def describe(step: ShardedStep) -> dict:
    wrapper = step.train_network
    inner = wrapper.network._backbone
    manager = wrapper.loss_scaling_manager
    return {"chain": chain(wrapper),
            "wrapper_micro_batches": getattr(wrapper, "micro_size", 1),
            "cut_into": getattr(inner, "micro_size", 1),
            "per_token_loss": wrapper.calculate_per_token_loss,
            "clip": float(wrapper.clip_grad_norm.clip_norm.asnumpy()) if wrapper.use_clip_grad else 0.0,
            "loss_scale_manager": type(manager).__name__ if manager is not None else None,
            "loss_scale": float(wrapper.scale_sense.asnumpy()),
            "lr_schedule": type(wrapper.learning_rate).__name__,
            "parallel_optimizer": ms.get_auto_parallel_context("enable_parallel_optimizer"),
            "strategy_file": ms.get_auto_parallel_context("strategy_ckpt_config")["save_file"]}


def main(out: Path) -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    found, samples = {}, ListSamples([Sample(list(range(1, 18)), list(range(1, 18)))])
    wrappers = {}
    for name, overrides in LAYOUTS.items():
        recipe = load_recipe(REPO / "recipes" / "cpu_smoke.yaml", [*ASCEND_TINY, *overrides])
        par = recipe.strategies.parallel
        session = setup(recipe, out / "run", samples, [], on_ascend=False)  # nothing compiles: no resume
        world, net = session.world, session.net
        wrappers[name] = type(session.step_fn.train_network)
        found[name] = dict(describe(session.step_fn), data=par.data, sharded=world.sharded,
                           eval_chain=chain(session.eval_cell), eval_batch=session.eval_batch,
                           layer_stages=[layer.pipeline_stage for layer in net.model.layers],
                           model_parallel=net.config.parallel_config.model_parallel,
                           # selftest's check of what was built, against this layout and another one
                           layout_problem=layout_problem(session, par),
                           other_layout_problem=layout_problem(session, replace(par, pipeline=3 - par.pipeline)))
    found["dpo_optimizer_shard"] = dpo_layout(out)
    (out / f"rank_{world.rank}.json").write_text(json.dumps(found, indent=1))
    register_order_ir(out, wrappers["pipeline2"])


def dpo_layout(out: Path) -> dict:
    """The DPO recipe's layout (data 2 x optimizer_shard, 2 micro-batches of 1 pair a rank):
    its reference pass over 4 pairs, the chain built after it, the context it left, and the
    rows of the first step's graph inputs (pair i's chosen reply ends with token 8 + i, its
    rejected one with 42 + i)."""
    recipe = load_recipe(REPO / "recipes" / "cpu_dpo_smoke.yaml",
                         [*ASCEND_TINY, "strategies.parallel.optimizer_shard=true", "train.global_batch_size=4"])

    def reply(first: int, n: int) -> Sample:
        return Sample(list(range(1, 4 + n)), [-100] * 3 + list(range(first, first + n)))

    source = PairSource([PairSample(reply(4, 5 + i), reply(40 + i, 3)) for i in range(4)])
    (out / "run_dpo").mkdir(exist_ok=True)
    ms.set_seed(recipe.train.seed)  # as a run's init_runtime: every rank starts from the same random weights
    session = setup(recipe, out / "run_dpo", source, [], on_ascend=False)
    step = session.step_fn
    batches = [session.stream.next_batch() for _ in range(2)]
    ids, labels, reference = step._inputs(batches)
    stored = out / "run_dpo" / "reference_logps.npz"
    split = step.train_network.network._backbone.network.network.split  # PreferenceLoss's pair split
    return dict(describe(step), data=recipe.strategies.parallel.data, sharded=session.world.sharded,
                layout_problem=layout_problem(session, recipe.strategies.parallel),
                full_batch=ms.get_auto_parallel_context("full_batch"),
                pair_split=type(split).__name__, pair_split_strategy=split.slice.in_strategy,
                reference=source.reference.tolist(),
                stored_reference=np.load(stored)["log_probs"].tolist() if stored.exists() else None,
                row_ends=[int(row[row != -100][-1]) for row in labels.asnumpy()],
                reference_rows=reference.asnumpy().tolist(), pairs_a_micro_batch=step.count(batches[0]),
                # the checkpointer's collective (resume agreement, the stop barrier) in the sharded run
                ranks_summed=float(all_reduce_sum(np.ones(1))[0]),
                full_batch_after=ms.get_auto_parallel_context("full_batch"))


def register_order_ir(out: Path, wrapper: type) -> None:
    """The wrapper class the pipeline layout's run built (the one of k > 1 and pipelines, based
    on MFPipelineWithLossScaleCell), on a Dense loss, built for the 910A's float-status
    registers, compiled up to the kernel selection the CPU fails on the register ops: its
    front-end IR in out/ir/rank_R, whose order test_parallel checks. Built under semi-auto
    parallel (its constructor needs it and a communication group), compiled stand-alone
    (semi-auto cannot compile on the CPU)."""
    import mindspore.nn.wrap.loss_scale as loss_scale

    ms.reset_auto_parallel_context()  # the layouts' settings (full_batch, strategy files) off
    ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel")
    net, real, loss_scale.MSContext = summed_loss(), loss_scale.MSContext, FakeSoC("ascend910")
    try:
        step = wrapper(
            net, nn.SGD(net.trainable_params(), 0.1), scale_sense=Tensor(1.0, ms.float32), micro_batch_num=2,
            use_clip_grad=False)
    finally:
        loss_scale.MSContext = real
    ms.reset_auto_parallel_context()
    ms.set_context(save_graphs=1, save_graphs_path=str(out / "ir"))
    try:
        step(Tensor(np.ones((2, 4), np.float32)))
    except RuntimeError as exc:
        if not re.search(r"Unsupported op \[NPU(Clear|Get)FloatStatusV2\] on CPU", str(exc)):
            raise
    finally:
        ms.set_context(save_graphs=0)


if __name__ == "__main__":
    if is_scheduler():  # msrun runs the script as the cluster's scheduler too
        run_scheduler()
    else:
        main(Path(sys.argv[1]))
