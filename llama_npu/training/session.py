"""`setup(recipe, run_dir, ...) -> Session`: everything a run's loop needs, built in order --
communication and layout, network, optimizer, train step, evaluation, checkpoints -- and
resumed, with the data stream and metrics placed at the step the run starts from."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Union

from mindspore import Parameter, nn
from mindspore.common import dtype as mstype

from ..checkpoints.policy import Checkpointer
from ..checkpoints.resume import resume
from ..common.console import note
from ..data.batches import BatchStream, ListSamples, first_batches
from ..data.mindrecord import MindRecordSamples
from ..data.samples import Sample
from ..memory.planned_peak import planned_peak_bytes
from ..model.architecture import LlamaShape, resolve_shape
from ..objectives import of as objective_of
from ..objectives.parts import ObjectiveParts
from ..recipe.problems import RecipeError
from ..recipe.schema import Recipe
from ..strategies.accumulation import accumulation_steps
from ..strategies.network import build_network
from ..strategies.offload import host_threads, on_host
from ..strategies.parallel import World, describe_layout, init_parallel, stream_layout
from ..strategies.precision import LossScaler, model_dtypes
from ..weights.pretrained import pretrained_hf_config
from .metrics import MetricLogger
from .optimizer import build_optimizer
from .sharded_step import EvalKeepingTrainStrategy, ShardedStep, eval_layout
from .step import TrainStep

if TYPE_CHECKING:  # for the annotation only: MindFormers is imported by mute_mindformers_info, stdout captured
    from mindformers.models.llama import LlamaForCausalLM

    from .host_step import HostStep


@dataclass
class Session:
    """Everything the loop needs, built by `setup`: the network and its train step, the
    data stream at the step the run starts from, evaluation, metrics and checkpoints."""
    recipe: Recipe
    run_dir: Path
    world: World
    on_ascend: bool
    net: LlamaForCausalLM
    params: list[Parameter]
    optimizer: nn.Cell  # an nn.Optimizer, or the host's states (training/host_optimizer.py)
    scaler: LossScaler
    objective: ObjectiveParts  # the loss cell, its normaliser, metrics and step preparation (objectives/)
    step_fn: Union[TrainStep, ShardedStep, "HostStep"]
    stream: BatchStream
    eval_cell: Union[nn.Cell, EvalKeepingTrainStrategy]
    eval_batch: int
    eval_samples: list[Sample]
    checkpointer: Checkpointer
    metrics: Optional[MetricLogger]  # rank 0's
    planned_peak: int
    start_step: int = 0
    rehearsal: Optional[dict] = None  # what training.rehearse shrank and could not rehearse
    schedule_steps: int = 0  # the lr schedule's length (training/schedule.py): max_steps unless resumed with another


def model_description(recipe: Recipe, shape: LlamaShape, params: list, run_dir: Path, world: World) -> Optional[dict]:
    """The config.json a full checkpoint carries, so eval, generate and convert take it."""
    if recipe.strategies.lora.enabled or world.sharded:  # adapters or shards: not a whole model to describe
        return None
    return {"format": "llama-npu", "shape": shape.__dict__, "dtype": str(params[0].dtype).lower(),
            "source": str(run_dir), "hf_config": pretrained_hf_config(recipe)}


def host_optimizer(recipe: Recipe, params: list, world: Optional[World] = None):
    """The host's states (strategies.offload.optimizer: host) for the card's `params`, this
    rank's range of them under data parallel, or None."""
    if not on_host(recipe):
        return None
    try:
        from .host_optimizer import HostAdamW  # imported here: it loads numba, which no other run needs
    except ImportError as exc:
        from .host_kernel_check import INSTALL

        raise RecipeError(f"strategies.offload.optimizer=host: the host update's kernel does not import ({exc}); "
                          f"install it: {INSTALL}") from None

    compute = model_dtypes(recipe.strategies.precision)["compute_dtype"]
    threads, world = host_threads(recipe.strategies.offload), world or World()
    host = HostAdamW(params, recipe.train.optimizer, threads, getattr(mstype, compute), world.rank, world.size)
    held = host.held_elements()
    # fp32 master, two moments and an accumulator a parameter
    share = "" if world.size == 1 else f" (rank {world.rank}'s range: {held:,} of {sum(p.size for p in params):,})"
    note(f"the optimizer on the host: {threads} thread(s), {16 * held / 2**30:.2f} GiB of fp32 master weights, "
         f"moments and gradient accumulators in host memory{share}; the card keeps {compute} weights")
    return host


def setup(recipe: Recipe, run_dir: Path, train_source: Union[ListSamples, MindRecordSamples],
          eval_samples: list[Sample], on_ascend: bool, resume_candidates: Optional[list] = None,
          warn_recipe_hash: bool = False, rehearsal: Optional[dict] = None,
          schedule_steps: Optional[int] = None) -> Session:
    """Build the run, then resume (`resume_candidates`, newest first; None: no resume asked)
    and place the data stream and metrics at the step it starts from."""
    t, parallel = recipe.train, recipe.strategies.parallel
    schedule_steps = schedule_steps or t.max_steps
    world = init_parallel(parallel, run_dir)
    note(describe_layout(recipe))
    batch_size, rank, ranks = stream_layout(parallel, world, t.micro_batch_size)
    scaler, k = LossScaler(recipe.strategies.precision), accumulation_steps(recipe)
    note(f"building the model{' and loading ' + recipe.model.checkpoint if recipe.model.checkpoint else ''}")
    net, loss_cell = build_network(recipe, on_ascend)
    # before a resume loads trained weights: a precomputed reference's are the start's
    objective = objective_of(recipe).parts(recipe, run_dir, net, loss_cell, train_source, world)
    loss_cell, count = objective.loss_cell, objective.count
    params, shape = net.trainable_params(), resolve_shape(recipe.model)
    host = host_optimizer(recipe, params, world)  # the fp32 masters and moments on the host, the card's copies halved
    if host is not None:
        from .host_step import HostStep  # imported here: as host_optimizer

        # What checkpoints hold: the fp32 masters, as without; under data parallel a rank holds
        # a range of them, and its whole weights are the card's (loop.save gathers the masters).
        optimizer, params = host, host.master_params if not host.sharded else host.card
        step_fn = HostStep(loss_cell, host, scaler, t.grad_clip, k, count=count)
    else:
        # Sharded layouts step through MindFormers' wrappers, which need the schedule in the graph.
        optimizer = build_optimizer(params, t, schedule_in_graph=world.sharded, schedule_steps=schedule_steps)
        step_fn = ShardedStep(net, optimizer, scaler, recipe, k, **(objective.sharded or {})) if world.sharded else TrainStep(
            loss_cell, optimizer, scaler, t.grad_clip, k, count=count)  # sharded: MindFormers' wrapper chain
    eval_cell, eval_batch = eval_layout(net, loss_cell, parallel, world, t.micro_batch_size)
    description = model_description(recipe, shape, host.master_params if host else params, run_dir, world)
    checkpointer = Checkpointer(run_dir, world, t.keep_last, description)
    stream_at = partial(BatchStream, train_source, batch_size, recipe.data.max_seq_len + 1, t.seed, rank=rank,
                        world=ranks)  # this rank's batches after a number of samples consumed
    start_step, samples_consumed = resume(recipe, checkpointer, resume_candidates, step_fn, host or net, optimizer,
                                          lambda: objective.prepared(first_batches(stream_at, k)), warn_recipe_hash)
    if host is not None and start_step:
        host.loaded()  # the loaded masters, halved, onto the card
    metrics = MetricLogger(run_dir, start_step) if world.is_main else None
    stream = stream_at(samples_consumed)
    planned_peak = planned_peak_bytes(recipe, shape, sum(p.size for p in params))
    note(f"model {recipe.model.preset} ({shape.describe()}); {sum(p.size for p in params):,} trainable "
         f"parameters{'' if world.size == 1 else f' (rank {world.rank} of {world.size})'}")
    return Session(recipe, run_dir, world, on_ascend, net, params, optimizer, scaler, objective, step_fn, stream,
                   eval_cell, eval_batch, eval_samples, checkpointer, metrics, planned_peak, start_step, rehearsal,
                   schedule_steps)
