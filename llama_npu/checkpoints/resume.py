"""Resuming a run: the checkpoint every rank agrees on, loaded in MindFormers' order."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from ..common.console import note, warn
from ..recipe.schema import Recipe
from .contract import Checkpointed
from .files import inspect
from .policy import Checkpointer


def compile_then_load(step: Checkpointed, example_batches: Callable[[], list], checkpointer: Checkpointer,
                      path) -> dict:
    """Load in MindFormers' order (base_trainer.training_process: compile_model, then
    load_checkpoint): a step that compiles ahead -- the sharded step, whose compile slices
    every Parameter to this rank's shard (mindspore/parallel/_utils.py) -- compiles before a
    rank_<R> shard is loaded into it; the others compile at their first call."""
    step.compile_before_load(example_batches)
    return checkpointer.load(path, step)


def resume(recipe: Recipe, checkpointer: Checkpointer, candidates: Optional[list], step: Checkpointed,
           example_batches: Callable[[], list], warn_recipe_hash: bool) -> tuple[int, int]:
    """(the step the run starts from, the samples consumed before it): (0, 0) without
    `candidates` (None: no resume asked; else newest first) or a checkpoint every rank has.
    `example_batches()` gives one step's micro-batches of the run's shapes."""
    if candidates is None:
        return 0, 0
    path = checkpointer.choose(candidates)
    start_step = inspect(path)[0]["step"] if path is not None else 0
    checkpointer.agree(start_step)
    if not start_step:
        return 0, 0
    state = compile_then_load(step, example_batches, checkpointer, path)
    if warn_recipe_hash and state.get("recipe_hash") != recipe.digest():
        warn(f"the recipe differs from the one {path} was trained with")
    if "loss_scale" in state:  # checked by inspect when present; a selftest's shards save none
        step.load_loss_scale_state(state["loss_scale"])
    checkpointer.start_branch(start_step)
    note(f"resumed from {path} at step {start_step}")
    return start_step, state.get("samples_consumed", 0)
