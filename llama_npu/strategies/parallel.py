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
  chain as the train step (steps/sharded_step.py). Each rank saves the strategy of its
  own graph, <run>/strategy/rank_<R>.ckpt (a pipeline stage's file holds only that stage's
  parameters; weights/merge_checkpoints.py merges them). MindSpore supports this on Ascend/GPU only ("Invalid
  communication backend: CPU for semi_auto_parallel"), so CI checks the configuration and
  the wrapper chain it builds, never a run.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..common.launcher import launched_workers
from ..model.architecture import resolve_shape
from ..recipe.problems import RecipeError, positive
from .accumulation import accumulation_steps, pipeline_micro_batches

KEY = "parallel"
CHECKED_AFTER = ("model",)  # the layout must divide the model's shape


@dataclass
class ParallelSection:
    # auto (null): the launched workers / (model x pipeline), resolved when the recipe loads.
    data: Optional[int] = None
    model: int = 1  # tensor (operator) parallel; Ascend only
    pipeline: int = 1  # pipeline stages; Ascend only
    micro_batches: int = 1  # pipeline micro-batches per step
    optimizer_shard: bool = False  # shard optimizer states across data parallel; Ascend only
    sequence_parallel: bool = False  # with model > 1
    vocab_emb_dp: bool = True  # keep the embedding/LM head data-parallel rather than split by model


SECTION = ParallelSection


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    sharded: bool = False  # semi-auto parallel: parameters and checkpoints are per rank

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def is_sharded(section) -> bool:
    """Whether a layout (a ParallelSection, or the planner's Strategy) shards parameters."""
    return section.model > 1 or section.pipeline > 1 or section.optimizer_shard


def resolve(recipe, workers: Optional[int]) -> None:
    """strategies.parallel.data=auto -> workers / (model x pipeline), when the recipe loads.
    Without a worker count (a plain process) auto is 1; the worker check (check_workers)
    then says what a layout with model or pipeline > 1 needs. An auto that does not resolve
    stays 1, so that the rest is checked as one process."""
    par = recipe.strategies.parallel
    if par.data is not None:
        return
    if workers is None:
        workers = launched_workers()
    par.data = 1
    for name in ("model", "pipeline"):
        positive(f"strategies.parallel.{name}", getattr(par, name))
    replica = par.model * par.pipeline
    if workers == 1:
        return
    if workers % replica:
        raise RecipeError(f"strategies.parallel.data=auto: {workers} workers do not divide into model {par.model} "
                          f"x pipeline {par.pipeline} = {replica}; launch a multiple of {replica} workers")
    par.data = workers // replica


def check_degrees(recipe) -> None:
    """The layout's counts, each 1 or more: what the objectives' batch checks divide by
    (recipe/validate.py runs them only once this passed)."""
    par = recipe.strategies.parallel
    for name in ("data", "model", "pipeline", "micro_batches"):
        positive(f"strategies.parallel.{name}", getattr(par, name))


def check(recipe) -> None:
    """Every layout that cannot work is refused here, before anything is built."""
    par, shape, t = recipe.strategies.parallel, resolve_shape(recipe.model), recipe.train
    check_degrees(recipe)
    if shape.num_heads % par.model or shape.num_kv_heads % par.model:
        raise RecipeError(f"strategies.parallel.model={par.model} must divide the attention heads "
                          f"({shape.num_heads}) and KV heads ({shape.num_kv_heads})")
    if shape.intermediate_size % par.model:
        raise RecipeError(f"strategies.parallel.model={par.model} must divide the MLP size "
                          f"({shape.intermediate_size})")
    if shape.vocab_size % par.model:
        raise RecipeError(f"strategies.parallel.model={par.model} must divide the vocabulary ({shape.vocab_size})")
    if par.sequence_parallel and recipe.data.max_seq_len % par.model:
        raise RecipeError(f"strategies.parallel.sequence_parallel splits data.max_seq_len={recipe.data.max_seq_len} "
                          f"across strategies.parallel.model={par.model} ranks; it must divide by {par.model}")
    if shape.num_layers % par.pipeline:
        raise RecipeError(f"strategies.parallel.pipeline={par.pipeline} must divide the layers "
                          f"({shape.num_layers})")
    if par.pipeline > 1 and par.micro_batches < par.pipeline:
        raise RecipeError(f"strategies.parallel.micro_batches={par.micro_batches} must be at least "
                          f"strategies.parallel.pipeline={par.pipeline}, or stages sit idle")
    if par.sequence_parallel and par.model == 1:
        raise RecipeError("strategies.parallel.sequence_parallel needs strategies.parallel.model > 1")
    sharded = [f"{k}={v}" for k, v in (("model", par.model), ("pipeline", par.pipeline)) if v > 1]
    sharded += ["optimizer_shard=true"] if par.optimizer_shard else []
    if sharded and recipe.strategies.chunked_ce.enabled:
        # Sharded layouts compute the loss with MindFormers' sharded CrossEntropyLoss
        # (steps/sharded_step.py); our chunked loss has a custom backward whose ops
        # carry no shard strategy.
        raise RecipeError(f"strategies.chunked_ce.enabled=true with strategies.parallel.{sharded[0]}: chunked "
                          f"cross-entropy has no sharded version (its custom backward has no shard strategy); "
                          f"disable one of them")
    if par.optimizer_shard and t.optimizer.name != "adamw":
        # mindspore/nn/optim/optimizer.py _use_parallel_optimizer: only Lamb, AdamWeightDecay
        # and AdaFactor shard their state; any other optimizer raises when it is built.
        raise RecipeError(f"train.optimizer.name={t.optimizer.name} with strategies.parallel.optimizer_shard=true: "
                          f"MindSpore shards only AdamW's state (AdamWeightDecay); use adamw or switch "
                          f"optimizer_shard off")
    if par.pipeline > 1 and (t.eval_every or recipe.data.eval_files):
        key = f"train.eval_every={t.eval_every}" if t.eval_every else "data.eval_files"
        raise RecipeError(f"{key} with strategies.parallel.pipeline={par.pipeline}: evaluation does not run "
                          f"through pipeline stages (MindFormers' PipelineCell acts in training only); merge the "
                          f"checkpoint (llama-npu merge-checkpoints) and run llama-npu eval on it")
    if sharded and recipe.device.target != "ascend":
        raise RecipeError(f"strategies.parallel.{sharded[0]} needs device.target=ascend: operator-sharded "
                          f"(semi_auto_parallel) training is not supported by MindSpore's CPU backend")




def run_scheduler() -> None:
    """The scheduler's whole job: take part in communication set-up until the workers are
    done. It trains nothing and writes nothing."""
    # imported here: recipe validation imports this module, and it needs no MindSpore
    import mindspore as ms
    from mindspore.communication import init

    # The heartbeat time-out after which the scheduler fails the launch (scripts/launch.sh,
    # NODE_TIMEOUT, says why it is short and why the workers keep MindSpore's own).
    if os.environ.get("LLAMA_NPU_SCHEDULER_NODE_TIMEOUT"):
        os.environ["MS_NODE_TIMEOUT"] = os.environ["LLAMA_NPU_SCHEDULER_NODE_TIMEOUT"]
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
    which MindFormers' wrappers divide (steps/sharded_step.py)."""
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
    # imported here: recipe validation imports this module, and it needs no MindSpore
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


def rehearse(r) -> None:
    """The rehearsal runs unsharded on its own processes: data parallel over them, if several."""
    par, workers = r.recipe.strategies.parallel, r.workers
    if par.data > 1 and workers == 1:
        r.not_rehearsed.append(f"data parallel over {par.data} processes: the rehearsal is one process "
                               f"(scripts/launch.sh RECIPE N --rehearse rehearses it over N CPU processes)")
    if is_sharded(par):
        layout = (f"data {par.data} x model {par.model} x pipeline {par.pipeline}"
                  f"{', optimizer sharded' if par.optimizer_shard else ''}")
        r.not_rehearsed.append(f"the sharded layout ({layout}): semi_auto_parallel needs Ascend; it was "
                               f"validated, and the rehearsal runs unsharded on {workers} process(es)")
    for key, value in (("data", workers), ("model", 1), ("pipeline", 1), ("micro_batches", 1),
                       ("optimizer_shard", False), ("sequence_parallel", False)):
        r.change(f"strategies.parallel.{key}", value, "the processes it runs on" if key == "data" else "")


# ---------------------------------------------------------------- planner term

def plan_settings(recipe) -> dict:
    """The layout (strategies.parallel.data already resolved from `auto` when the recipe loaded)."""
    p = recipe.strategies.parallel
    return {"data": p.data, "model": p.model, "pipeline": p.pipeline, "optimizer_shard": p.optimizer_shard,
            "sequence_parallel": p.sequence_parallel, "vocab_emb_dp": p.vocab_emb_dp}


def layers_on_device(shape, s) -> int:
    return shape.num_layers // s.pipeline


def vocab_split(s) -> int:
    """Ways the embedding and the LM head's logits are split: by model parallel unless vocab_emb_dp."""
    return 1 if s.vocab_emb_dp else s.model


def optimizer_split(s) -> int:
    """Ways the optimizer states are split: over data parallel with optimizer sharding."""
    return s.data if s.optimizer_shard else 1


def norm_split(s) -> int:
    """Ways the norms' activations are split: over model parallel with sequence parallel."""
    return s.model if s.sequence_parallel else 1


def micro_batches_in_flight(s) -> int:
    """1F1B: pipeline stage 0 holds one micro-batch a stage (at most the step's)."""
    return min(s.pipeline, s.accumulation) if s.pipeline > 1 else 1


def communicators(s) -> int:
    return (s.data > 1) + (s.model > 1) + (s.pipeline > 1)


def layout_efficiency(s) -> float:
    """The share of a device's time left by the pipeline bubble and model-parallel communication."""
    bubble = (s.pipeline - 1) / (s.accumulation + s.pipeline - 1) if s.pipeline > 1 else 0.0
    return (1 - bubble) * (0.9 ** (s.model.bit_length() - 1))


def layouts(shape, devices: int):
    """(data, model, pipeline) of every layout of `devices` that divides the model's shape."""
    for model in range(1, devices + 1):
        for pipeline in range(1, devices // model + 1):
            if devices % (model * pipeline):
                continue
            if shape.num_heads % model or shape.num_kv_heads % model or shape.intermediate_size % model:
                continue
            if shape.num_layers % pipeline:
                continue
            yield devices // (model * pipeline), model, pipeline
