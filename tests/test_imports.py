"""The recipe sits at the bottom of the package: recipe/schema.py imports only leaves (modules that
import nothing from the package), so no import circle can pass through it and every module
may validate a recipe before MindSpore is loaded."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "llama_npu"


def package_imports(path: Path) -> set[str]:
    """The package modules `path` imports anywhere in it, as dotted names under llama_npu."""
    here = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here[:len(here) - node.level + 1]
            found.add(".".join([*base, *(node.module.split(".") if node.module else [])]))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("llama_npu"):
            found.add(node.module)
    return found


def module_path(dotted: str) -> Path:
    path = PACKAGE.parent.joinpath(*dotted.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


@pytest.mark.quick
def test_recipe_imports_only_leaves():
    imported = package_imports(PACKAGE / "recipe/schema.py")
    assert imported, "recipe/schema.py reads its shapes, formats, devices and launcher environment from leaves"
    not_leaves = {name: sorted(package_imports(module_path(name))) for name in imported
                  if package_imports(module_path(name)) - {"llama_npu.data", "llama_npu.memory"}}
    assert not not_leaves, f"recipe/schema.py imports modules that import the package: {not_leaves}"


@pytest.mark.quick
def test_validating_a_recipe_loads_no_mindspore_or_numpy():
    code = ("import sys; from llama_npu.recipe.schema import load_recipe; load_recipe('recipes/cpu_smoke.yaml'); "
            "print(sorted(m for m in ('mindspore', 'mindformers', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
