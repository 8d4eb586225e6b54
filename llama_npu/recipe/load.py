"""A recipe read from YAML, with --set's KEY=VALUE overrides, each value coerced to its key's
type, then completed and validated.

Everything here is pure Python so that a bad recipe is refused in well under a second,
before MindSpore (slow to import) is touched.
"""
from __future__ import annotations

import dataclasses
import difflib
import typing
from pathlib import Path
from typing import Any, List, Optional

import yaml

from ..objectives import OBJECTIVES
from ..strategies import STRATEGIES
from .coerce import coerce
from .foreign_names import key_elsewhere, leaves, named_config
from .problems import Problems, RecipeError
from .schema import DEFAULT_MAX_STEPS, Recipe
from .validate import validate


def _printable(key: str) -> str:
    """`key` as an error line can show it: a newline or another control character escaped."""
    return key if key.isprintable() else repr(key)[1:-1]


def _unknown_key(key: str, candidates) -> RecipeError:
    """A key the section lacks, with the key meant: the same name in another section or another
    trainer's name for one of ours, else a near-typo of one of `candidates`."""
    meant = key_elsewhere(key)  # a known name first: 'data_parallel' is close to 'sequence_parallel'
    name = key.rsplit(".", 1)[-1]
    key = _printable(key)
    if meant:
        return RecipeError(f"unknown key '{key}'; use {meant}")
    close = difflib.get_close_matches(name, list(candidates), n=1)
    hint = f" (did you mean '{key.rsplit('.', 1)[0] + '.' if '.' in key else ''}{close[0]}'?)" if close else ""
    return RecipeError(f"unknown key '{key}'{hint}")


def _unknown_keys(key: str, value: Any, candidates) -> List[str]:
    """The lines for an unknown key: under a mapping (a DeepSpeed section) or a JSON file it
    names (`deepspeed: ds_z3.json`), one for each key at any depth that names one of ours,
    else the key's own line."""
    named = named_config(value)
    inside = value if isinstance(value, dict) else named or {}
    lines = []
    for path in leaves(inside):
        meant = key_elsewhere(f"{key}.{path}")
        if meant:
            where = f"'{key}' ({value} sets {path})" if named else f"'{key}.{path}'"
            lines.append(f"unknown key {_printable(where)}; use {meant}")
    return lines if lines and not named else [str(_unknown_key(key, candidates))] + lines


def _build(cls, data: Any, prefix: str, problems: Problems):
    """Build dataclass `cls` from a mapping; an unknown key or a wrong type is a problem,
    and the key keeps its default so the rest can still be checked."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        problems.append(f"{prefix or 'recipe'}: expected a mapping of keys, got {data!r}")
        return cls()
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            problems += _unknown_keys(full, value, fields)
            continue
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value, full, problems)
        elif problems.passes(coerce, value, tp, full):  # a refused value leaves the default
            kwargs[key] = coerce(value, tp, full)
    return cls(**kwargs)


def _apply_override(tree: dict, assignment: str, cls=Recipe) -> None:
    """Apply one `a.b.c=value` to the raw mapping `tree`, checking the key path exists."""
    if "=" not in assignment:
        raise RecipeError(f"--set {assignment!r}: expected KEY=VALUE, e.g. train.max_steps=20")
    key, raw = assignment.split("=", 1)
    parts = key.strip().split(".")
    key = _printable(key)
    node, node_cls = tree, cls
    for depth, part in enumerate(parts):
        hints = typing.get_type_hints(node_cls)
        path = ".".join(parts[: depth + 1])
        if part not in hints:
            raise _unknown_key(path, hints)
        tp = hints[part]
        if depth == len(parts) - 1:
            if dataclasses.is_dataclass(tp):
                raise RecipeError(f"--set {key}: '{path}' is a section; set one of its keys")
            # YAML parsing gives 1e-4 -> float, true -> bool, [a, b] -> list; _build coerces.
            try:
                node[part] = yaml.safe_load(raw) if raw.strip() else ""
            except (yaml.YAMLError, ValueError, RecursionError):  # see load_recipe
                node[part] = raw
        else:
            if not dataclasses.is_dataclass(tp):
                raise RecipeError(f"--set {key}: '{path}' is not a section")
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node, node_cls = node[part], tp


def load_recipe(path: str | Path, overrides: Optional[List[str]] = None,
                workers: Optional[int] = None) -> Recipe:
    """Read, override, coerce and validate a recipe. Relative data paths are left as
    written: they resolve against the current directory (the shipped recipes expect the
    repository root). `workers`: the processes the run will have (validate --workers, plan
    --devices); by default the ones msrun launched, 1 for a plain process."""
    return recipe_from_dict(read_tree(path), overrides, workers)


def read_tree(path: str | Path) -> dict:
    """A recipe file's YAML mapping, as written."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"recipe file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError(f"{path}: not UTF-8 text (byte offset {exc.start}); save the recipe as UTF-8") from None
    try:
        tree = yaml.safe_load(text) or {}
    # PyYAML raises ValueError for an escape past U+10FFFF ("\U00110000"), RecursionError for
    # thousands of nested brackets
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        mark = getattr(exc, "problem_mark", None)
        at = mark.index if mark else getattr(exc, "position", None)  # a ReaderError (a control character) has no mark
        where = f"{path}:{text.count(chr(10), 0, at) + 1}" if at is not None else str(path)
        what = getattr(exc, "problem", None) or exc
        raise RecipeError(f"{where}: not valid YAML ({' '.join(str(what).split())})") from None
    if not isinstance(tree, dict):
        raise RecipeError(f"{path}: expected a mapping with sections model, data, train, strategies, device")
    return tree


def _steps_or_epochs(train) -> None:
    """The run's length in one of two ways: train.max_steps (DEFAULT_MAX_STEPS when neither is
    given) or train.epochs (steps counted from the data when it is read, recipe/run_length.py);
    the other stays null, and so a run's recipe.yaml records which the user gave."""
    if train.max_steps is not None and train.epochs is not None:
        raise RecipeError(f"train.max_steps={train.max_steps} and train.epochs={train.epochs}: give one of them "
                          f"(--set train.max_steps=null to count the run in epochs)")
    if train.max_steps is None and train.epochs is None:
        train.max_steps = DEFAULT_MAX_STEPS


def recipe_from_dict(tree: dict, overrides: Optional[List[str]] = None, workers: Optional[int] = None) -> Recipe:
    """Build and validate a recipe from a mapping (changed in place by `overrides`, --set's
    KEY=VALUE assignments); `workers` as for load_recipe."""
    problems = Problems()
    for assignment in overrides or []:
        problems.check(_apply_override, tree, assignment)
    recipe = _build(Recipe, tree, "", problems)
    problems.check(_steps_or_epochs, recipe.train)
    # A key refused above keeps its default, so the checks below still see well-typed values.
    for strategy in STRATEGIES:
        if hasattr(strategy, "resolve"):
            problems.check(strategy.resolve, recipe, workers)
    for objective in OBJECTIVES:  # a deprecated key read as its successor
        problems.check(objective.resolve, recipe)
    problems.check(validate, recipe)
    problems.raise_any()
    return recipe

