"""Preference tuning's losses (DPO, IPO and reference-free SimPO and ORPO, as TRL 0.24.0 defines them)
and their references: the checks of the `dpo:` section's keys for them (the section itself and
train.objective: training/objective_config.py). Pure Python: validate and plan load no MindSpore.

Which reference a loss compares with (docs/preference-tuning.md says what each costs):
- precomputed: the starting weights' log-probs of every training pair, computed before step 1;
- adapters_off: the LoRA policy with its adapters switched off (no second copy);
- none: no reference; only the reference-free SimPO and ORPO.
"""
from __future__ import annotations

from ..recipe.problems import Problems, choice, positive

LOSSES = ("sigmoid", "ipo", "simpo", "orpo")
REFERENCES = ("precomputed", "adapters_off", "none")
# trl/trainer/cpo_trainer.py and orpo_trainer.py: their losses read no reference model
REFERENCE_FREE = ("simpo", "orpo")
# dpo_trainer.py concatenated_forward (ipo); cpo_trainer.py and orpo_trainer.py (average_log_prob=True)
LENGTH_NORMALISED = ("ipo", "simpo", "orpo")


def check(recipe) -> None:
    """The loss's keys and what its reference requires of the strategies (DPO runs only)."""
    problems = Problems()
    if recipe.train.objective != "dpo":
        return
    d = recipe.dpo
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
    if recipe.data.eval_files:
        problems.append("data.eval_files with train.objective=dpo: a DPO run scores no held-out data in this version; "
                        "leave data.eval_files empty")
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

