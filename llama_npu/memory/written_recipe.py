"""What `plan --fit --write-recipe` settles besides the layout, so that the written recipe
trains as it is: every path absolute (a two-node launch reads it on both nodes, from any
working directory), and train.max_steps within what the training data bears."""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import List, Tuple

from ..recipe.base_weights import CHECKPOINT_PLACEHOLDER
from ..recipe.load import recipe_from_dict
from ..recipe.schema import Recipe


def _absolute(path: str) -> str:
    return str(Path(path).resolve()) if path and path != "-" else path


def absolute_paths(tree: dict) -> dict:
    """`tree` (a recipe's mapping) with its data files, prepared directory, checkpoint and a
    tokenizer.json path absolute, resolved against the current directory."""
    data, model = tree["data"], tree["model"]
    data["train_files"] = [_absolute(p) for p in data["train_files"]]
    data["eval_files"] = [_absolute(p) for p in data["eval_files"]]
    data["prepared"] = _absolute(data["prepared"])
    if model["checkpoint"] != CHECKPOINT_PLACEHOLDER:  # the placeholder must stay what validate names
        model["checkpoint"] = _absolute(model["checkpoint"])
    if Path(data["tokenizer"]).is_file():  # a path, not the name of the shipped one
        data["tokenizer"] = _absolute(data["tokenizer"])
    return tree


def ready_to_train(recipe: Recipe) -> Tuple[Recipe, List[str]]:
    """(the recipe with absolute paths and train.max_steps at most validate's MAX_PASSES
    passes over its training rows, what changed)."""
    # imported here: tokenizing loads numpy, which the plan itself does not need
    from ..objectives import run_samples
    from ..recipe.run_length import MAX_PASSES, with_steps
    from ..strategies.accumulation import step_rows

    tree, changed = absolute_paths(recipe.to_dict()), []
    with contextlib.redirect_stdout(sys.stderr):  # the reading's notes; plan --json prints only its object
        rows = len(run_samples(recipe)[0])  # as validate counts them: tokenized, packed, pairs
    most = max(1, MAX_PASSES * rows // step_rows(recipe))
    recipe = with_steps(recipe, rows)  # train.epochs counted
    if recipe.train.max_steps > most:
        changed.append(f"max_steps {recipe.train.max_steps} -> {most} ({rows} training rows, {step_rows(recipe)} a "
                       f"step: at most {MAX_PASSES} passes)")
        t, train = recipe.train, tree["train"]
        train["max_steps"], train["epochs"] = most, None
        train["save_every"] = min(t.save_every, most)
        # The schedule keeps its shape: a warm-up longer than the run would leave it at a
        # fraction of the peak lr with no cosine, and an eval_every past the end evaluates nothing.
        if t.warmup_steps:
            train["warmup_steps"] = max(1, t.warmup_steps * most // t.max_steps)
            changed.append(f"warmup_steps {t.warmup_steps} -> {train['warmup_steps']} (the same share of the run)")
        if t.eval_every > most:
            train["eval_every"] = most
            changed.append(f"eval_every {t.eval_every} -> {most}")
    return recipe_from_dict(tree), changed
