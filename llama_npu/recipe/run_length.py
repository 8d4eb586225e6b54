"""The run's length: train.epochs counted as steps, and the most passes over the training data
a length should take.

train.epochs counts the run in passes over the training data: the steps follow from its rows
once they are read, as the Hugging Face Trainer (and so LLaMA-Factory) counts them
(transformers/trainer.py _inner_training_loop: the whole steps of an epoch, at least one,
times num_train_epochs, rounded up).

On resume, the schedule keeps the length the run started with (recipe/resume_checks.py,
schedule_steps). Pure Python: validate and plan use it without MindSpore; training/data_size.py
warns with it and memory/written_recipe.py (plan --fit --write-recipe) caps train.max_steps by it.
"""
from __future__ import annotations

import dataclasses
import math

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
