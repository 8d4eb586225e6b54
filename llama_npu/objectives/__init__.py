"""The training objectives, one module (or package) each, picked by `train.objective`: what a
step's loss is, whereas a strategy (strategies/) changes how the same loss is computed. The
recipe, the data readers, the session, the loop, the steps, the planner, rehearse, the
pre-flight and `eval --data` go through OBJECTIVES and name no objective; an objective's
code, messages aside, lives here.

Each objective is an instance of a subclass of objectives/contract.py Objective, which names
everything an objective gives (its recipe section and checks, the records it reads and how
they become batches, its loss cell, reference and normaliser, its planner term, its scoring,
its rehearsal) with a default for each optional hook: the callers call every hook.

Adding an objective (a reward model, KTO): write its module here with a subclass of
Objective, its instance as the module's OBJECTIVE, add the module's name to OBJECTIVES, and
give it its recipe, data, docs and tests; nothing outside objectives/ changes.
"""
from __future__ import annotations

import dataclasses
import importlib

# train.objective's values, in the order validate names them: an objective is registered by
# adding its module's name here, one line in its commit (the modules import as the package's).
OBJECTIVES = tuple(importlib.import_module(f"{__name__}.{name}").OBJECTIVE for name in ("sft", "dpo", "kto"))
NAMES = tuple(objective.NAME for objective in OBJECTIVES)


def old_truncation_keys() -> list:
    """(section, key, {value: mode}) of the objectives' keys that held data.truncation's mode
    before it existed: recipe/stored.py reads a run's older recipe.yaml by them."""
    return [(o.NAME, *o.OLD_TRUNCATION) for o in OBJECTIVES if o.OLD_TRUNCATION]


def named(name: str):
    """The objective train.objective `name` picks (validate refuses any other name)."""
    return {objective.NAME: objective for objective in OBJECTIVES}[name]


def of(recipe):
    """The recipe's objective."""
    return named(recipe.train.objective)


def records_of(objective):
    """The objective's RecordKind, refusing the other objectives' records by name."""
    others = tuple(other.RECORDS for other in OBJECTIVES if other is not objective)
    return dataclasses.replace(objective.RECORDS, others=others)


def run_samples(recipe):
    """(the training source, the held-out samples) of the recipe's objective, one tokenizer
    for both. A bad record deep in a file stops the run here, before its directory is touched."""
    from ..data.tokenizer import load_tokenizer  # imported here: it loads tokenizers, validate's checks before not

    objective = of(recipe)
    return objective.samples(recipe, load_tokenizer(recipe.data.tokenizer), records_of(objective))


def scoring(is_of_kind):
    """The objective with a scoring of its own (SCORES) whose records `is_of_kind(kind)` says
    the eval data is, or None (eval --data then scores loss and perplexity)."""
    for objective in OBJECTIVES:
        if objective.SCORES and is_of_kind(objective.RECORDS):
            return objective
    return None
