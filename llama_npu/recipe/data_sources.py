"""The checks of where a run's records come from and how they are read: data.dataset (the
entries of a LLaMA-Factory dataset_info.json, data/dataset_info.py) against data.train_files,
data.columns' keys for the recipe's format and objective, data.tags and data.label_values.
Each problem is one line, found before anything is tokenized."""
from __future__ import annotations

from ..data.dataset_info import (DATA_CONFIG, column_problems, entry_problems, load_info, named_inputs,
                                 recipe_column_keys, split_names)
from ..data.errors import RecordError
from ..data.turn_tags import tag_problems
from ..data.label_values import LABEL_VALUES
from ..objectives import NAMES, named
from .problems import Problems, RecipeError

# Keys an entry brings itself, so that a recipe naming data.dataset cannot also give them.
OWN_KEYS = ("train_files", "prepared", "columns", "tags")


def check_sources(recipe) -> None:
    """Raise RecipeError listing every problem of the data's sources and maps."""
    d, problems = recipe.data, Problems()
    # the objective's records decide the known columns and whether an entry is ranking data
    kind = named(recipe.train.objective).RECORDS if recipe.train.objective in NAMES else None
    if d.dataset or d.eval_dataset:
        problems += _dataset_problems(d, kind.ranking if kind else False)
    elif kind is not None and d.format in kind.read_keys:
        keys = recipe_column_keys(kind.read_keys[d.format])
        problems += column_problems(d.columns, keys, f"data.columns (data.format={d.format}, "
                                                     f"train.objective={recipe.train.objective})")
    problems += tag_problems(d.tags, "data.tags")
    problems += _label_problems(d.label_values)
    if d.max_samples is not None and d.max_samples < 1:
        problems.append(f"data.max_samples: expected a positive number of records (or null: all), got {d.max_samples}")
    problems.raise_any()


def _dataset_problems(d, ranking: bool) -> list:
    given = [f"data.{key}" for key in OWN_KEYS if getattr(d, key)] + (["data.format"] if d.format != "alpaca" else [])
    if d.dataset and given:
        return [f"data.dataset names {DATA_CONFIG} entries, which bring their own files, formatting, columns and "
                f"tags: remove {', '.join(given)}"]
    if d.eval_dataset and d.eval_files:
        return ["data.eval_dataset and data.eval_files both name held-out data: keep one"]
    try:
        info = load_info(d.dataset_dir)
        problems = [line for name in dict.fromkeys(split_names(d.dataset + d.eval_dataset)) if name in info
                    for line in entry_problems(name, info[name], ranking)]
        if not problems:
            named_inputs(d, d.dataset + d.eval_dataset)  # unknown names, missing files
        return problems
    except RecordError as exc:
        return [str(exc)]


def _label_problems(values: dict) -> list:
    problems = [f"data.label_values.{side}: unknown key; expected desirable and undesirable" for side in values
                if side not in LABEL_VALUES]
    problems += [f"data.label_values.{side}: expected a list of one or more values" for side, listed in values.items()
                 if side in LABEL_VALUES and not listed]
    sides = [{str(v).strip().lower() for v in values.get(side, default)} for side, default in LABEL_VALUES.items()]
    both = sorted(sides[0] & sides[1])
    if both:
        problems.append(f"data.label_values: {', '.join(both)} is both desirable and undesirable")
    return problems
