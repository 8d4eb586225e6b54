"""Data, model (tensor), pipeline and optimizer parallelism on MindSpore's distributed
runtime: we configure and launch it (scripts/launch.sh runs msrun), we do not reimplement it.

- data parallel only: `parallel_mode='data_parallel'`. Each rank reads its own share of
  every global batch (data/batches.py), and our TrainStep all-reduces the accumulated
  gradients once per optimizer step, weighting each rank by its share of the step's target
  tokens. Runs on CPU and Ascend; tested on CPU with two msrun workers.
- model / pipeline / optimizer sharding: `parallel_mode='semi_auto_parallel'` with
  MindFormers' parallel_config (data_parallel, model_parallel, pipeline_stage,
  micro_batch_num, use_seq_parallel, vocab_emb_dp), `full_batch=True` (every rank reads the
  same batch; MindSpore splits it by the data-parallel strategy), and MindFormers' wrapper
  chain as the train step (training/sharded_step.py). Each rank saves the strategy of its
  own graph, <run>/strategy/rank_<R>.ckpt (a pipeline stage's file holds only that stage's
  parameters; checkpoints/merge.py merges them). MindSpore supports this on Ascend/GPU only ("Invalid
  communication backend: CPU for semi_auto_parallel"), so CI checks the configuration and
  the wrapper chain it builds, never a run.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..common.launcher import launched_workers
from ..recipe.schema import ParallelSection, RecipeError, accumulation_steps


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    sharded: bool = False  # semi-auto parallel: parameters and checkpoints are per rank

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def is_sharded(section: ParallelSection) -> bool:
    return section.model > 1 or section.pipeline > 1 or section.optimizer_shard


def run_scheduler() -> None:
    """The scheduler's whole job: take part in communication set-up until the workers are
    done. It trains nothing and writes nothing."""
    import mindspore as ms
    from mindspore.communication import init

    ms.set_device("CPU")
    init()


def auto_parallel_context(section: ParallelSection, workers: int, strategy_file: Path) -> dict:
    """Keyword arguments for mindspore.set_auto_parallel_context."""
    if not is_sharded(section):
        # gradients_mean=False: TrainStep weights each rank by its target tokens itself.
        return {"parallel_mode": "data_parallel", "gradients_mean": False, "device_num": workers}
    context = {"parallel_mode": "semi_auto_parallel", "device_num": workers, "full_batch": True,
               "enable_parallel_optimizer": section.optimizer_shard,
               "strategy_ckpt_save_file": str(strategy_file)}
    if section.pipeline > 1:
        context["pipeline_stages"] = section.pipeline
    return context


def mindformers_model_options(section: ParallelSection) -> dict:
    """LlamaConfig switches of sharded layouts: the loss returns (numerator, denominator),
    which MindFormers' wrappers divide (training/sharded_step.py)."""
    return {"calculate_per_token_loss": True} if is_sharded(section) else {}


def mindformers_parallel_config(section: ParallelSection) -> dict:
    """The parallel part of MindFormers' parallel_config (recompute is added by strategies/network.py).
    Pure data parallel runs a full replica per rank: MindFormers' own layout stays 1."""
    if not is_sharded(section):
        return {}
    return {"data_parallel": section.data, "model_parallel": section.model,
            "pipeline_stage": section.pipeline, "micro_batch_num": section.micro_batches,
            "use_seq_parallel": section.sequence_parallel, "vocab_emb_dp": section.vocab_emb_dp}


def check_workers(section: ParallelSection, workers: int) -> None:
    needed = section.data * section.model * section.pipeline
    if needed != workers:
        how = (f"launch it with scripts/launch.sh RECIPE {needed} (validate it with --workers {needed})"
               if workers == 1 else "change the layout or the launch")
        raise RecipeError(f"strategies.parallel: data {section.data} x model {section.model} x pipeline "
                          f"{section.pipeline} = {needed} workers, but {workers} {'is' if workers == 1 else 'are'} "
                          f"running; {how}")


def describe_layout(recipe) -> str:
    par, t = recipe.strategies.parallel, recipe.train
    workers = par.data * par.model * par.pipeline
    mode = ("semi_auto_parallel (Ascend only)" if is_sharded(par)
            else "data parallel" if workers > 1 else "single device")
    return (f"{workers} worker(s), {mode}: data {par.data} x model {par.model} x pipeline {par.pipeline}"
            f"{', optimizer sharded' if par.optimizer_shard else ''}; {accumulation_steps(recipe)} "
            f"micro-batch(es) of {t.micro_batch_size} per rank and step")


def strategy_file(run_dir: Path, rank: int) -> Path:
    """Where rank R saves the sharding strategy of its train graph: one file per rank, so
    each pipeline stage's layout survives (with one shared path the ranks overwrite each
    other's)."""
    return Path(run_dir) / "strategy" / f"rank_{rank}.ckpt"


def init_parallel(section: ParallelSection, run_dir: Path) -> World:
    """Initialise communication when msrun launched us, and check the layout fills it.
    Again in the same process (tests/sharded_chain.py builds several layouts) it keeps the
    communication and replaces the layout."""
    workers = launched_workers()
    check_workers(section, workers)
    if workers == 1:
        return World()
    import mindspore as ms
    from mindspore.communication import GlobalComm, get_group_size, get_rank, init

    if not GlobalComm.INITED:
        init()
    rank = get_rank()
    ms.reset_auto_parallel_context()
    ms.set_auto_parallel_context(**auto_parallel_context(section, workers, strategy_file(run_dir, rank)))
    return World(rank=rank, size=get_group_size(), sharded=is_sharded(section))


def stream_layout(section: ParallelSection, world: World, micro_batch_size: int):
    """(batch_size, rank, ranks) for the BatchStream of this process. Data parallel: each
    rank reads its own micro-batch. Semi-auto parallel (full_batch): every rank reads the
    whole data-parallel batch -- times the pipeline's micro-batches when pipelining -- and
    MindSpore splits it."""
    if world.sharded:
        return micro_batch_size * section.data * pipeline_micro_batches(section), 0, 1
    return micro_batch_size, world.rank, world.size


def pipeline_micro_batches(section: ParallelSection) -> int:
    return section.micro_batches if section.pipeline > 1 else 1
