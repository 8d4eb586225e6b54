"""The recipe sits at the bottom of the package: no import circle passes through recipe/ (its
modules import the strategies, whose sections and checks it gathers, and leaves; nothing they
import comes back to them), so every module may validate a recipe before MindSpore is loaded."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "llama_npu"


def package_imports(path: Path, package: Path = PACKAGE) -> set[str]:
    """The package modules `path` imports anywhere in it, as dotted names under llama_npu
    (`from . import lora` names the module llama_npu.strategies.lora)."""
    here = path.relative_to(package.parent).with_suffix("").parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here[:len(here) - node.level + 1]
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("llama_npu"):
            module = node.module
        else:
            continue
        found.add(module)
        found.update(f"{module}.{alias.name}" for alias in node.names
                     if module_path(f"{module}.{alias.name}").is_file())
    return found


def module_path(dotted: str) -> Path:
    path = PACKAGE.parent.joinpath(*dotted.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def reached(dotted: str) -> set[str]:
    """Every package module `dotted` imports, directly or through the modules it imports."""
    seen, todo = set(), [dotted]
    while todo:
        for name in package_imports(module_path(todo.pop())) - seen:
            seen.add(name)
            todo.append(name)
    return seen


@pytest.mark.quick
def test_no_import_circle_passes_through_the_recipe():
    recipe_modules = [f"llama_npu.recipe.{path.stem}" for path in sorted((PACKAGE / "recipe").glob("*.py"))]
    assert "llama_npu.strategies.lora" in reached("llama_npu.recipe.schema"), "the recipe gathers the strategies"
    circles = [name for name in recipe_modules if name in reached(name)]
    assert not circles, f"these recipe modules import themselves back through the package: {circles}"


@pytest.mark.quick
def test_validating_a_recipe_loads_no_mindspore_or_numpy():
    code = ("import sys; from llama_npu.recipe.load import load_recipe; load_recipe('recipes/cpu_smoke.yaml'); "
            "print(sorted(m for m in ('mindspore', 'mindformers', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


LONGEST_FUNCTION = 60  # lines, decorators and docstring included: the project's own bound


@pytest.mark.quick
def test_no_function_of_the_package_is_longer_than_60_lines():
    longer = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                if node.end_lineno - first + 1 > LONGEST_FUNCTION:
                    longer.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} "
                                  f"({node.end_lineno - first + 1} lines)")
    assert longer == []


# Each room and the rooms above it that it must not import (docs/architecture.md): checkpoints/
# owns the contract the steps implement (checkpoints/contract.py), and the steps are built by
# the run, not the other way round.
NOT_IMPORTED_BY = {"checkpoints": ("steps", "training"), "steps": ("training",)}


def upward_imports(package: Path) -> list[str]:
    """'file imports module' for each import of NOT_IMPORTED_BY's rooms into a room it forbids."""
    found = []
    for room, above in NOT_IMPORTED_BY.items():
        for path in sorted((package / room).rglob("*.py")):
            found += [f"{path.relative_to(package.parent)} imports {name}"
                      for name in sorted(package_imports(path, package))
                      if name.split(".")[1] in above]
    return found


@pytest.mark.quick
def test_checkpoints_import_neither_the_steps_nor_the_run_and_the_steps_not_the_run(tmp_path):
    assert not upward_imports(PACKAGE)
    # The check sees such an import where one is written (relative, as the package writes them).
    for room, line in (("checkpoints", "from ..steps import Step"), ("steps/host", "from ...training.loop import save")):
        (tmp_path / "llama_npu" / room).mkdir(parents=True)
        (tmp_path / "llama_npu" / room / "planted.py").write_text(line + "\n", encoding="utf-8")
    assert upward_imports(tmp_path / "llama_npu") == [
        "llama_npu/checkpoints/planted.py imports llama_npu.steps",
        "llama_npu/steps/host/planted.py imports llama_npu.training.loop"]


# What a step, its optimizer, the network or an objective offers is its contract's
# (steps/contract.py, checkpoints/contract.py, objectives/contract.py): the run and the
# checkpoints call it rather than ask by duck typing.
CONTRACTED = ("step", "optimizer", "net", "network", "objective", "host")


def duck_typed_questions(package: Path) -> list[str]:
    """'file:line getattr(x, ...)' for each getattr/hasattr in checkpoints/ and training/ whose
    object is named for something with a contract."""
    found = []
    for room in ("checkpoints", "training"):
        for path in sorted((package / room).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id in ("getattr", "hasattr") and node.args):
                    asked = ast.unparse(node.args[0])
                    if any(word in CONTRACTED for word in asked.replace(".", "_").split("_")):
                        found.append(f"{path.relative_to(package.parent)}:{node.lineno} {node.func.id}({asked}, ...)")
    return found


@pytest.mark.quick
def test_the_run_and_the_checkpoints_ask_no_step_optimizer_net_or_objective_by_duck_typing(tmp_path):
    assert not duck_typed_questions(PACKAGE)
    (tmp_path / "llama_npu" / "training").mkdir(parents=True)
    (tmp_path / "llama_npu" / "checkpoints").mkdir()
    (tmp_path / "llama_npu" / "training" / "loop.py").write_text(
        'def gathers(s):\n    return getattr(s.optimizer, "sharded", False)\n', encoding="utf-8")
    assert duck_typed_questions(tmp_path / "llama_npu") == [
        "llama_npu/training/loop.py:2 getattr(s.optimizer, ...)"]
