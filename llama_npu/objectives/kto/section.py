"""KTO (train.objective: kto; Ethayarajh et al., 2024), as TRL 0.24.0's KTOTrainer defines it:
the `kto:` section and its checks. Pure Python: validate and plan load no MindSpore.

The data are single replies with a thumbs up or down (records.py), the loss TRL's kto_loss
with its KL estimate from mismatched completions (loss.py), estimated once an optimizer step
(kl_estimate.py; docs/kto.md says what that costs).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...recipe.problems import Problems, choice, positive

NAME = "kto"
REFERENCES = ("precomputed", "adapters_off")


@dataclass
class KtoSection:
    beta: float = 0.1  # KTOConfig.beta: how far from the reference a reward counts
    # KTOConfig's: a desirable (undesirable) reply's loss is weighed by this, to counter
    # unequal numbers of the two (TRL advises weight x count in a ratio of 1 to 4/3).
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0
    # precomputed: the starting weights' log-probs of every reply and of the KL completions
    # of every planned step, before step 1; adapters_off: the LoRA policy with its adapters off.
    reference: str = "precomputed"


def check(recipe) -> None:
    """The section's keys, and what KTO cannot take from the data and strategy sections."""
    k, d, problems = recipe.kto, recipe.data, Problems()
    problems.check(positive, "kto.beta", k.beta)
    problems.check(positive, "kto.desirable_weight", k.desirable_weight)
    problems.check(positive, "kto.undesirable_weight", k.undesirable_weight)
    problems.check(choice, "kto.reference", k.reference, REFERENCES)
    if recipe.train.objective != NAME:
        problems.raise_any()
        return
    if k.reference == "adapters_off" and not recipe.strategies.lora.enabled:
        problems.append("kto.reference=adapters_off needs strategies.lora.enabled=true (the reference is the policy "
                        "with its adapters off); use kto.reference=precomputed for a full fine-tune")
    for wrong, why in ((d.pack, "data.pack: true with train.objective: kto; each reply is scored one sequence a row: "
                                "set data.pack: false"),
                       (d.format == "text", "data.format: text with train.objective: kto; KTO records are alpaca or "
                                            "sharegpt records with a boolean 'label'"),
                       (d.prepared, "data.prepared with train.objective: kto; prepare-data writes SFT samples, so "
                                    "give the labelled replies as data.train_files"),
                       (d.train_on_prompt, "data.train_on_prompt: true with train.objective: kto; only the reply "
                                           "tokens are scored: set data.train_on_prompt: false"),
                       (bool(d.eval_files or d.eval_dataset),
                        "data.eval_files with train.objective=kto (or data.eval_dataset): a KTO run scores no held-out "
                        "data while training in this version; score it after with llama-npu eval --checkpoint RUN "
                        "--data FILE")):
        if wrong:
            problems.append(why)
    par = recipe.strategies.parallel
    if par.model > 1 or par.pipeline > 1 or par.optimizer_shard:
        problems.append(f"train.objective=kto with strategies.parallel model={par.model}, pipeline={par.pipeline}, "
                        f"optimizer_shard={str(par.optimizer_shard).lower()}: KTO's KL pass runs before the unsharded "
                        f"step only in this version; use data parallel (model 1, pipeline 1, optimizer_shard false)")
    problems.raise_any()
    t = recipe.train
    per_rank = (t.global_batch_size // par.data if t.global_batch_size else t.micro_batch_size)
    if per_rank < 2:
        # TRL refuses a per-device batch of 1 for the same reason (kto_trainer.py __init__).
        problems.append(f"train.objective=kto with {per_rank} reply a step on each rank (train.global_batch_size="
                        f"{t.global_batch_size}, micro_batch_size={t.micro_batch_size}, data parallel {par.data}): "
                        f"the KL estimate pairs each prompt with another reply of the same step, so a step needs at "
                        f"least 2 replies a rank; raise train.global_batch_size")
    problems.raise_any()
