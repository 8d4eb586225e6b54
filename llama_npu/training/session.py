"""`setup(recipe, run_dir, ...) -> Session`: everything a run's loop needs, built in order --
communication and layout, network, optimizer, train step, evaluation, checkpoints -- and
resumed, with the data stream and metrics placed at the step the run starts from."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Union

from mindspore import Parameter, nn

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
from ..recipe.schema import Recipe
from ..strategies.accumulation import accumulation_steps
from ..strategies.network import build_network
from ..strategies.parallel import World, describe_layout, init_parallel, stream_layout
from ..strategies.precision import LossScaler
from ..weights.pretrained import pretrained_hf_config
from ..steps import Step, build_step
from ..steps.sharded_step import EvalKeepingTrainStrategy, eval_layout
from .metrics import MetricLogger

if TYPE_CHECKING:  # for the annotation only: MindFormers is imported by mute_mindformers_info, stdout captured
    from mindformers.models.llama import LlamaForCausalLM


@dataclass
class Session:
    """Everything the loop needs, built by `setup`: the network and its train step, the
    data stream at the step the run starts from, evaluation, metrics and checkpoints."""
    recipe: Recipe
    run_dir: Path
    world: World
    on_ascend: bool
    net: LlamaForCausalLM
    params: list[Parameter]  # the step's (steps/contract.py)
    scaler: LossScaler
    objective: ObjectiveParts  # the loss cell, its normaliser, metrics and step preparation (objectives/)
    step_fn: Step
    stream: BatchStream
    eval_cell: Union[nn.Cell, EvalKeepingTrainStrategy]
    eval_batch: int
    eval_samples: list[Sample]
    checkpointer: Checkpointer
    metrics: Optional[MetricLogger]  # rank 0's
    planned_peak: int
    start_step: int = 0
    rehearsal: Optional[dict] = None  # what training.rehearse shrank and could not rehearse
    schedule_steps: int = 0  # the lr schedule's length (recipe/resume_checks.py): max_steps unless resumed with another


def model_description(recipe: Recipe, shape: LlamaShape, run_dir: Path, world: World) -> Optional[dict]:
    """The config.json a full checkpoint carries, so eval, generate and convert take it (its
    dtype is the saved weights', filled in by checkpoints/policy.py at each save)."""
    if recipe.strategies.lora.enabled or world.sharded:  # adapters or shards: not a whole model to describe
        return None
    return {"format": "llama-npu", "shape": shape.__dict__, "dtype": None,
            "source": str(run_dir), "hf_config": pretrained_hf_config(recipe)}


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
    loss_cell = objective.loss_cell
    step_fn = build_step(recipe, net, objective, scaler, world, schedule_steps)
    params, shape = step_fn.params, resolve_shape(recipe.model)
    eval_cell, eval_batch = eval_layout(net, loss_cell, parallel, world, t.micro_batch_size)
    checkpointer = Checkpointer(run_dir, world, t.keep_last, model_description(recipe, shape, run_dir, world))
    stream_at = partial(BatchStream, train_source, batch_size, recipe.data.max_seq_len + 1, t.seed, rank=rank,
                        world=ranks)  # this rank's batches after a number of samples consumed
    start_step, samples_consumed = resume(recipe, checkpointer, resume_candidates, step_fn,
                                          lambda: objective.prepared(first_batches(stream_at, k)), warn_recipe_hash)
    metrics = MetricLogger(run_dir, start_step) if world.is_main else None
    stream = stream_at(samples_consumed)
    planned_peak = planned_peak_bytes(recipe, shape, sum(p.size for p in params))
    note(f"model {recipe.model.preset} ({shape.describe()}); {sum(p.size for p in params):,} trainable "
         f"parameters{'' if world.size == 1 else f' (rank {world.rank} of {world.size})'}")
    return Session(recipe, run_dir, world, on_ascend, net, params, scaler, objective, step_fn, stream,
                   eval_cell, eval_batch, eval_samples, checkpointer, metrics, planned_peak, start_step, rehearsal,
                   schedule_steps)
