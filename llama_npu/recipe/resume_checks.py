"""What a resume checks of its recipe against the run directory's (recipe/stored.py reads it):
which keys changed, whether one of them changes what the run trains (refused without --force),
and how long the learning-rate schedule stays.

The schedule keeps the length the run started with (its checkpoint's state.json says it; older
checkpoints, the run's recipe.yaml) unless train.reschedule is true: lr_at continues at its
floor past that length, so a run given more steps does not jump back up the cosine.

The keys whose change changes the result name the objectives' sections, so the caller
(training/preflight.py, RESULT_KEYS) hands them in: recipe/ imports no objective for them.
Pure Python: validate runs it without MindSpore.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..common.console import note
from .schema import Recipe, with_absolute_paths
from .stored import STORED_RECIPE, stored_recipe

NOT_RESULT_KEYS = ("data.eval_files", "data.eval_dataset")  # what is evaluated, not what is trained


def flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def changes_result(key: str, result_keys: tuple) -> bool:
    """Whether changing `key` changes what the run trains: it starts with one of `result_keys`."""
    return key.startswith(result_keys) and not key.startswith(NOT_RESULT_KEYS)


@dataclass
class RecipeDifference:
    """How the recipe of a resume differs from the one the run was started with."""
    changed: dict = field(default_factory=dict)  # key -> (stored value, new value)
    result_keys: tuple = ()  # the prefixes of the keys that change what the run trains (changes_result)

    @property
    def refused(self) -> list:
        return [key for key in self.changed if changes_result(key, self.result_keys)]

    def describe(self, keys) -> str:
        return ", ".join(f"{k} {self.changed[k][0]!r} -> {self.changed[k][1]!r}" for k in keys)


def recipe_difference(stored: Recipe, recipe: Recipe, result_keys: tuple) -> RecipeDifference:
    # The stored recipe's paths are absolute (training/run.py, open_run_dir); the same file named
    # relative to the current directory is no change.
    old, new = flatten(with_absolute_paths(stored).to_dict()), flatten(with_absolute_paths(recipe).to_dict())
    return RecipeDifference({k: (old.get(k), new[k]) for k in new if old.get(k) != new[k]}, result_keys)


def check_resume_recipe(recipe: Recipe, run_dir: Path, force: bool, result_keys: tuple) -> list:
    stored = stored_recipe(run_dir)
    if stored is None:
        return []
    difference = recipe_difference(stored, recipe, result_keys)
    if not difference.refused or force:
        return []
    return [f"resume: the recipe changes {difference.describe(difference.refused)} from "
            f"{run_dir / STORED_RECIPE}, which changes what the run trains; resume without that change, "
            f"or pass --force to continue anyway"]


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
