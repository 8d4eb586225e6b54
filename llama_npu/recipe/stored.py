"""A run directory's recipe.yaml: the recipe the run was started with, overrides applied.

`train` writes it once, when the run starts. Every command that takes a run directory
(train --resume and validate, eval / generate / quantize / convert ms-to-hf on a run,
merge-checkpoints) reads it here, through the recipe schema, so all of them see the same
keys with the same defaults.

A recipe.yaml written before data.truncation existed ran what is now keep_prompt (or what an
objective's own old key held, objectives.old_truncation_keys): it is read so, and a resume
whose recipe names no truncation keeps it (data/truncation.py).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import List, Optional

from ..common.console import note
from ..data.truncation import BEFORE_THE_KEY
from .load import read_tree, recipe_from_dict
from .problems import RecipeError
from .schema import Recipe

STORED_RECIPE = "recipe.yaml"


def _names(tree: dict, section: str, key: str) -> bool:
    return isinstance(tree.get(section), dict) and key in tree[section]


def _predates_truncation(tree: dict) -> bool:
    return not _names(tree, "data", "truncation")


def _truncation_keys() -> list:
    from ..objectives import old_truncation_keys  # imported here: the objectives import recipe/

    return [("data", "truncation", {})] + old_truncation_keys()


def _as_it_ran(tree: dict) -> dict:
    """A tree written before data.truncation, with the mode its run had in that key."""
    out, mode = dict(tree), BEFORE_THE_KEY
    for section, key, modes in _truncation_keys()[1:]:
        held = tree.get(section) if isinstance(tree.get(section), dict) else {}
        mode = modes.get(held.get(key), mode)
        if section in tree:
            out[section] = {k: v for k, v in held.items() if k != key}
    data = tree.get("data") if isinstance(tree.get("data"), dict) else {}
    return {**out, "data": {**data, "truncation": mode}}


def stored_recipe(run_dir: Path, overrides: Optional[List[str]] = None) -> Optional[Recipe]:
    """The recipe `run_dir` was started with, `overrides` (--set) applied on top, or None
    when the directory has none."""
    path = Path(run_dir) / STORED_RECIPE
    if not path.is_file():
        return None
    try:
        tree = read_tree(path)
        recipe = recipe_from_dict(_as_it_ran(tree) if _predates_truncation(tree) else tree)
    except RecipeError as exc:
        raise RecipeError(f"{path}: cannot be read as a recipe ({exc})") from None
    return recipe_from_dict(recipe.to_dict(), overrides) if overrides else recipe


def resumed_truncation(recipe: Recipe, recipe_file: Path, overrides: Optional[List[str]], run_dir: Path) -> Recipe:
    """`recipe` (from `recipe_file` and `overrides`) resuming `run_dir`: when the run's
    recipe.yaml predates data.truncation and neither names a truncation, with the mode the
    run started with."""
    path = Path(run_dir) / STORED_RECIPE
    keys = [(section, key) for section, key, _ in _truncation_keys()]
    named = any(_names(read_tree(recipe_file), *key) for key in keys) or any(
        o.split("=", 1)[0].strip() in {f"{s}.{k}" for s, k in keys} for o in overrides or [])
    if named or not path.is_file() or not _predates_truncation(read_tree(path)):
        return recipe
    mode = stored_recipe(run_dir).data.truncation
    if mode != recipe.data.truncation:
        note(f"resume: data.truncation: {mode}, as the run started ({path} predates the key; the recipe names none)")
    return dataclasses.replace(recipe, data=dataclasses.replace(recipe.data, truncation=mode))


def owning_recipe(checkpoint: Path) -> Optional[Recipe]:
    """The recipe of the run `checkpoint` is (a run directory) or belongs to (a step directory
    under its checkpoints/), or None for a directory of converted weights."""
    for run_dir in (Path(checkpoint), Path(checkpoint).parent.parent):
        recipe = stored_recipe(run_dir)
        if recipe is not None:
            return recipe
    return None
