"""The objectives are parts (llama_npu/objectives/__init__.py): outside objectives/ no module
names one in its code, and the recipe is built from the registry. Pure Python, about a second."""
from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from llama_npu import objectives
from llama_npu.objectives.contract import Objective
from llama_npu.recipe.load import load_recipe
from llama_npu.recipe.schema import Recipe

PACKAGE = Path(__file__).resolve().parent.parent / "llama_npu"
DPO_SMOKE = PACKAGE.parent / "recipes" / "cpu_dpo_smoke.yaml"
# A word of an identifier or path (not "threaDPOol"): at its start or after a non-letter.
NAMED = re.compile(r"(?<![a-z])(dpo|kto|preference)", re.IGNORECASE)


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
    assert all(isinstance(objective, Objective) for objective in objectives.OBJECTIVES)
    assert len(set(objectives.NAMES)) == len(objectives.NAMES)
    sections = [o.NAME for o in objectives.OBJECTIVES if o.SECTION]
    assert [f.name for f in dataclasses.fields(Recipe)] == ["model", "data", "train", "strategies", "device",
                                                            *sections]
    for name in sections:
        assert isinstance(getattr(Recipe(), name), objectives.named(name).SECTION)


class PairsOnly(Objective):
    """A new objective written against the contract with its required parts only: it reads
    DPO's pairs (so that a DPO recipe picks it) and has none of DPO's optional hooks."""
    NAME = "dpo"
    RECORDS = objectives.named("dpo").RECORDS

    def check(self, recipe):
        pass

    def samples(self, recipe, tokenizer, records):
        return objectives.named("dpo").samples(recipe, tokenizer, records)

    def parts(self, recipe, run_dir, net, loss_cell, source, world):
        return objectives.named("dpo").parts(recipe, run_dir, net, loss_cell, source, world)

    def plan_settings(self, recipe):
        return {}


def test_an_objective_lacking_a_required_part_is_refused_by_name():
    class Nameless(Objective):
        RECORDS = PairsOnly.RECORDS
        check, samples, parts, plan_settings = PairsOnly.check, PairsOnly.samples, PairsOnly.parts, \
            PairsOnly.plan_settings

    with pytest.raises(TypeError, match="NAME"):
        Nameless()


def rehearsed_and_checked():
    """(the rehearsal's data.max_seq_len, data.on_bad_record and change list of the DPO smoke
    recipe under keep_prompt, the pre-flight's record problems at data.max_seq_len 24) with the objective
    the registry holds now."""
    from llama_npu.data.tokenizer import load_tokenizer
    from llama_npu.training.preflight import check_records
    from llama_npu.training.rehearse import rehearse

    rehearsal, shrunk, _ = rehearse(load_recipe(DPO_SMOKE, ["data.truncation=keep_prompt"]))
    short = load_recipe(DPO_SMOKE, ["data.truncation=keep_prompt", "data.max_seq_len=24"])
    d = rehearsal.data
    return d.max_seq_len, d.on_bad_record, shrunk, check_records(short, load_tokenizer(short.data.tokenizer))


def test_a_new_objective_gets_the_contracts_defaults_where_the_callers_call_its_hooks(monkeypatch):
    """Rehearse, the pre-flight, eval's scoring and the stored recipe's reader call every hook:
    DPO's own leave out of the rehearsal the shipped pairs whose prompts leave no reply in its
    32 tokens, note its first pairs and refuse the pairs a 24-token row leaves no reply; the
    bare objective's defaults take the SFT rehearsal's 32 tokens as they are, note nothing,
    refuse nothing and score none."""
    length, on_bad_record, shrunk, problems = rehearsed_and_checked()
    assert (length, on_bad_record) == (32, "skip")
    assert any(line.startswith("the first 6 training pairs only") for line in shrunk)
    assert any("leaves no room for a reply within data.max_seq_len=24" in line for line in problems)
    assert objectives.scoring(lambda kind: kind is PairsOnly.RECORDS).NAME == "dpo"
    assert objectives.old_truncation_keys() != []

    monkeypatch.setattr(objectives, "OBJECTIVES", (objectives.named("sft"), PairsOnly()))
    length, on_bad_record, shrunk, problems = rehearsed_and_checked()
    assert (length, on_bad_record) == (32, "error")
    assert not any(line.startswith("the first") or "left out of the rehearsal" in line for line in shrunk)
    assert problems == []
    assert objectives.scoring(lambda kind: kind is PairsOnly.RECORDS) is None
    assert objectives.old_truncation_keys() == []
    source = object()
    assert PairsOnly().rehearsal_source(source, objectives.named("sft")) is source
