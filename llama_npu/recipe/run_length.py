"""The run's length and its learning-rate schedule's length, and the most a length should
read the training data.

train.epochs counts the run in passes over the training data: the steps follow from its rows
once they are read, as the Hugging Face Trainer (and so LLaMA-Factory) counts them
(transformers/trainer.py _inner_training_loop: the whole steps of an epoch, at least one,
times num_train_epochs, rounded up).

On resume, the schedule keeps the length the run started with (its checkpoint's state.json
says it; older checkpoints, the run's recipe.yaml) unless train.reschedule is true: lr_at
continues at its floor past that length, so a run given more steps does not jump back up the
cosine. Pure Python: validate and plan use it without MindSpore; training/data_size.py warns
with it and memory/written_recipe.py (plan --fit --write-recipe) caps train.max_steps by it.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

from ..common.console import note
from ..strategies.accumulation import step_rows

# Passes over the training rows beyond which a run learns them by heart. A bound on the run's
# length (train.max_steps against the data), so it sits with the length's counting, where both
# the run's warning (training/data_size.py) and the plan's written recipe import it downward.
MAX_PASSES = 20


def with_steps(recipe, rows: int, say: bool = False):
    """The recipe with train.max_steps counted from train.epochs over `rows` training rows (as
    given when the user gave max_steps); `say`: print how at the start of a run."""
    t = recipe.train
    if t.epochs is None:
        return recipe
    per_step = step_rows(recipe)
    steps = max(1, math.ceil(t.epochs * max(rows // per_step, 1)))
    if say:
        note(f"train.epochs: {t.epochs} epochs = {steps:,} steps of {per_step:,} x {recipe.data.max_seq_len:,} "
             f"tokens ({rows:,} training rows, {max(rows // per_step, 1):,} steps an epoch)")
    return dataclasses.replace(recipe, train=dataclasses.replace(t, max_steps=steps))


def schedule_steps(train, started_with: Optional[int], say: bool = True) -> int:
    """The length of the lr schedule of a run whose train section is `train` (max_steps counted),
    resumed from a run whose schedule was `started_with` steps long (None: not a resume)."""
    if started_with is None or started_with == train.max_steps:
        return train.max_steps
    if train.reschedule:
        if say:
            note(f"train.reschedule=true: the learning-rate schedule is stretched from the {started_with:,} steps the "
                 f"run started with to {train.max_steps:,}")
        return train.max_steps
    if say:
        floor = train.optimizer.lr * train.min_lr_ratio
        past = (f"continues at its floor, {floor:.3g}, from step {started_with:,} to {train.max_steps:,}"
                if train.max_steps > started_with else f"stops at step {train.max_steps:,}, before its end")
        note(f"the learning-rate schedule keeps the {started_with:,} steps the run started with and {past}; "
             f"--set train.reschedule=true stretches it to {train.max_steps:,} steps instead")
    return started_with
