"""A run directory's recipe.yaml: the recipe the run was started with, overrides applied.

`train` writes it once, when the run starts. Every command that takes a run directory
(train --resume and validate, eval / generate / quantize / convert ms-to-hf on a run,
merge-checkpoints) reads it here, through the recipe schema, so all of them see the same
keys with the same defaults.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

from .load import load_recipe, recipe_from_dict
from .problems import RecipeError
from .schema import Recipe

STORED_RECIPE = "recipe.yaml"


def stored_recipe(run_dir: Path, overrides: Optional[List[str]] = None) -> Optional[Recipe]:
    """The recipe `run_dir` was started with, `overrides` (--set) applied on top, or None
    when the directory has none."""
    path = Path(run_dir) / STORED_RECIPE
    if not path.is_file():
        return None
    try:
        recipe = load_recipe(path)
    except RecipeError as exc:
        raise RecipeError(f"{path}: cannot be read as a recipe ({exc})") from None
    return recipe_from_dict(recipe.to_dict(), overrides) if overrides else recipe


def owning_recipe(checkpoint: Path) -> Optional[Recipe]:
    """The recipe of the run `checkpoint` is (a run directory) or belongs to (a step directory
    under its checkpoints/), or None for a directory of converted weights."""
    for run_dir in (Path(checkpoint), Path(checkpoint).parent.parent):
        recipe = stored_recipe(run_dir)
        if recipe is not None:
            return recipe
    return None
