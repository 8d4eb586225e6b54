"""The `dpo:` section (train.objective: dpo) and its checks: preference tuning's losses (DPO,
IPO and reference-free SimPO and ORPO, as TRL 0.24.0 defines them), their references, and
what the objective refuses of the data section and the layouts. Pure Python: validate and
plan load no MindSpore.

Which reference a loss compares with (docs/preference-tuning.md says what each costs):
- precomputed: the starting weights' log-probs of every training pair, computed before step 1;
- adapters_off: the LoRA policy with its adapters switched off (no second copy);
- none: no reference; only the reference-free SimPO and ORPO.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ...common.console import warn
from ...data.truncation import DEFAULT
from ...recipe.problems import Problems, RecipeError, choice, positive

NAME = "dpo"
# Deprecated: data.truncation holds it for every objective; each value's mode there.
ON_LONG_PAIR = {"truncate": "keep_prompt", "drop": "drop"}
# the key of this section that held the truncation mode before data.truncation, and its values' modes
OLD_TRUNCATION = ("on_long_pair", ON_LONG_PAIR)
LOSSES = ("sigmoid", "ipo", "simpo", "orpo")
REFERENCES = ("precomputed", "adapters_off", "none")
# trl/trainer/cpo_trainer.py and orpo_trainer.py: their losses read no reference model
REFERENCE_FREE = ("simpo", "orpo")
# dpo_trainer.py concatenated_forward (ipo); cpo_trainer.py and orpo_trainer.py (average_log_prob=True)
LENGTH_NORMALISED = ("ipo", "simpo", "orpo")


@dataclass
class DpoSection:
    # Deprecated (data.truncation): truncate reads as keep_prompt, drop as drop; "": unset.
    on_long_pair: str = ""
    # The loss and its reference (TRL 0.24.0's meanings).
    beta: float = 0.1  # DPOConfig.beta: how far from the reference a reward counts
    loss: str = "sigmoid"  # sigmoid | ipo | simpo | orpo
    label_smoothing: float = 0.0  # conservative DPO (sigmoid, simpo): the chance a label is flipped
    simpo_gamma: float = 0.5  # CPOConfig.simpo_gamma: SimPO's target reward margin
    orpo_lambda: float = 0.1  # ORPOConfig.beta: the odds-ratio term's weight beside the NLL (orpo reads no dpo.beta)
    reference: str = "precomputed"  # precomputed | adapters_off | none


def check(recipe) -> None:
    """In a DPO run's recipe, what DPO cannot take from the data section, the loss's keys and
    what its reference requires of the strategies."""
    problems, d = Problems(), recipe.dpo
    if recipe.train.objective == NAME:
        problems += data_problems(recipe.data)
        problems.check(loss_checks, recipe)
    problems.raise_any()


def resolve(recipe) -> None:
    """dpo.on_long_pair, deprecated, read as data.truncation (which then holds it alone), with
    one line naming the new key; refused beside a data.truncation that says otherwise."""
    value, data = recipe.dpo.on_long_pair, recipe.data
    if not value:
        return
    choice("dpo.on_long_pair", value, tuple(ON_LONG_PAIR))
    mode = ON_LONG_PAIR[value]
    if data.truncation not in (DEFAULT, mode):
        raise RecipeError(f"dpo.on_long_pair: {value} (deprecated: data.truncation: {mode}) beside data.truncation: "
                          f"{data.truncation}; remove dpo.on_long_pair")
    if recipe.train.objective == NAME:  # a stored recipe of another objective carries the old default
        _deprecated(f"dpo.on_long_pair: {value} is deprecated; it reads as data.truncation: {mode}, the key for every "
                    f"objective: write that instead")
    data.truncation, recipe.dpo.on_long_pair = mode, ""


@functools.cache
def _deprecated(message: str) -> None:  # once a process: a run reads its recipe more than once
    warn(message)


def data_problems(d) -> list:
    problems = []
    if d.pack:
        problems.append("data.pack: true with train.objective: dpo; a pair's chosen and rejected rows are "
                        "scored one sequence a row, so DPO data is not packed: set data.pack: false")
    if d.format == "text":
        problems.append("data.format: text with train.objective: dpo; preference pairs are alpaca or sharegpt "
                        "records with 'chosen' and 'rejected'")
    if d.prepared:
        problems.append("data.prepared with train.objective: dpo; prepare-data writes SFT samples, so give "
                        "the preference pairs as data.train_files")
    if d.train_on_prompt:
        problems.append("data.train_on_prompt: true with train.objective: dpo; only the reply tokens of a "
                        "pair are scored: set data.train_on_prompt: false")
    return problems


def loss_checks(recipe) -> None:
    """The loss's keys and what its reference requires of the strategies."""
    problems, d = Problems(), recipe.dpo
    problems.check(positive, "dpo.beta", d.beta)
    problems.check(choice, "dpo.loss", d.loss, LOSSES)
    problems.check(choice, "dpo.reference", d.reference, REFERENCES)
    if not 0.0 <= d.label_smoothing < 0.5:
        problems.append(f"dpo.label_smoothing: expected a value in [0, 0.5), got {d.label_smoothing}")
    problems.check(positive, "dpo.simpo_gamma", d.simpo_gamma, True)
    problems.check(positive, "dpo.orpo_lambda", d.orpo_lambda)
    if d.reference == "none" and d.loss in LOSSES and d.loss not in REFERENCE_FREE:
        problems.append(f"dpo.reference=none with dpo.loss={d.loss}: {d.loss} compares with a reference; "
                        f"use dpo.reference precomputed or adapters_off, or dpo.loss simpo")
    if d.loss in REFERENCE_FREE and d.reference != "none":
        problems.append(f"dpo.loss={d.loss} with dpo.reference={d.reference}: {d.loss} is reference-free, "
                        f"a reference would cost memory and time for nothing; set dpo.reference=none")
    if d.reference == "adapters_off" and not recipe.strategies.lora.enabled:
        problems.append("dpo.reference=adapters_off needs strategies.lora.enabled=true (the reference is the "
                        "policy with its adapters off); use dpo.reference=precomputed for a full fine-tune")
    if recipe.data.eval_files or recipe.data.eval_dataset:
        problems.append("data.eval_files with train.objective=dpo (or data.eval_dataset): a DPO run scores no held-out "
                        "data in this version; leave data.eval_files and data.eval_dataset empty")
    par = recipe.strategies.parallel
    if par.model > 1 or par.pipeline > 1:
        # Under semi-auto parallel the pair loss's ops split the batch axis only (InterleavedPairs'
        # strategy, and the default of the others, which splits dimension 0 over every card:
        # the data-parallel split only when model and pipeline are 1); with pipeline stages
        # only the last would compute the pairs' loss and metrics.
        problems.append(f"train.objective=dpo with strategies.parallel model={par.model}, pipeline={par.pipeline}: "
                        f"DPO's pair loss splits only the batch across cards, so it runs unsharded, data parallel "
                        f"or data parallel with optimizer_shard in this version; set model and pipeline to 1")
    elif par.optimizer_shard and d.reference == "adapters_off":
        problems.append("dpo.reference=adapters_off with strategies.parallel.optimizer_shard=true: the adapters-off "
                        "reference runs in the unsharded step only, and a LoRA run's optimizer states are small; "
                        "switch optimizer_shard off (data parallel) or use dpo.reference=precomputed")
    problems.raise_any()
