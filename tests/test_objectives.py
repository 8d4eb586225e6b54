"""The objectives are parts (llama_npu/objectives/__init__.py): outside objectives/ no module
names one in its code, and the recipe is built from the registry. Pure Python, about a second."""
from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from llama_npu import objectives
from llama_npu.recipe.schema import Recipe

PACKAGE = Path(__file__).resolve().parent.parent / "llama_npu"
# A word of an identifier or path (not "threaDPOol"): at its start or after a non-letter.
NAMED = re.compile(r"(?<![a-z])(dpo|kto|preference)", re.IGNORECASE)
# What every objective module provides (the rest of the contract is optional: hasattr).
REQUIRED = ("NAME", "SECTION", "FOREIGN_NAMES", "check", "RECORDS", "samples", "parts", "plan_settings")


def objective_names_in_code(source: str) -> list[str]:
    """The identifiers, imported module paths and compared string literals of `source` that
    name an objective; docstrings, comments and messages may."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, ast.keyword):
            names = [node.arg or ""]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [getattr(node, "module", None) or ""] + [alias.name for alias in node.names] + \
                [alias.asname or "" for alias in node.names]
        elif isinstance(node, ast.Compare):  # `x == "dpo"`, `x in ("sft", "dpo")`
            names = [c.value for operand in [node.left, *node.comparators] for c in ast.walk(operand)
                     if isinstance(c, ast.Constant) and isinstance(c.value, str)]
        else:
            continue
        found += [name for name in names if NAMED.search(name)]
    return found


def test_the_scan_finds_an_objective_named_in_code():
    assert objective_names_in_code('if recipe.train.objective == "dpo":\n    pass\n') == ["dpo"]
    assert objective_names_in_code('ok = kind in ("sft", "kto")\n') == ["kto"]
    assert objective_names_in_code("from .preference_parts import pairs_of\n") == ["preference_parts"]
    assert objective_names_in_code("loss = recipe.dpo.beta\n") == ["dpo"]
    assert objective_names_in_code("from concurrent.futures import ThreadPoolExecutor\n") == []
    assert objective_names_in_code('"""DPO\'s pairs: train.objective dpo."""\nraise ValueError("dpo.beta")\n') == []


def test_no_module_outside_objectives_names_an_objective_in_its_code():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] == "objectives":
            continue
        names = objective_names_in_code(path.read_text(encoding="utf-8"))
        if names:
            offenders[str(relative)] = sorted(set(names))
    assert offenders == {}


def test_the_recipe_takes_its_objective_sections_from_the_registry():
    for objective in objectives.OBJECTIVES:
        assert [name for name in REQUIRED if not hasattr(objective, name)] == [], objective.__name__
    assert len(set(objectives.NAMES)) == len(objectives.NAMES)
    sections = [o.NAME for o in objectives.OBJECTIVES if o.SECTION]
    assert [f.name for f in dataclasses.fields(Recipe)] == ["model", "data", "train", "strategies", "device",
                                                            *sections]
    for name in sections:
        assert isinstance(getattr(Recipe(), name), objectives.named(name).SECTION)
