"""The training objective's recipe keys: `train.objective` (sft | dpo) and the `dpo:`
section, with their checks. Pure Python: `validate` and `plan` read it without MindSpore.
The preference data it trains on: data/pairs.py."""
from __future__ import annotations

from dataclasses import dataclass

from ..recipe.problems import Problems, choice

OBJECTIVES = ("sft", "dpo")
ON_LONG_PAIR = ("truncate", "drop")


@dataclass
class DpoSection:
    # A pair whose longer reply does not fit data.max_seq_len: cut both replies there, or
    # leave the pair out; the run counts both.
    on_long_pair: str = "truncate"  # truncate | drop
    # The loss and its reference (objectives/preference.py checks them; TRL 0.24.0's meanings).
    beta: float = 0.1  # DPOConfig.beta: how far from the reference a reward counts
    loss: str = "sigmoid"  # sigmoid | ipo | simpo | orpo
    label_smoothing: float = 0.0  # conservative DPO (sigmoid, simpo): the chance a label is flipped
    simpo_gamma: float = 0.5  # CPOConfig.simpo_gamma: SimPO's target reward margin
    orpo_lambda: float = 0.1  # ORPOConfig.beta: the odds-ratio term's weight beside the NLL (orpo reads no dpo.beta)
    reference: str = "precomputed"  # precomputed | adapters_off | none


def check_objective(recipe) -> None:
    """train.objective and the dpo section, and what DPO cannot take from the data section."""
    d, problems = recipe.data, Problems()
    problems.check(choice, "train.objective", recipe.train.objective, OBJECTIVES)
    problems.check(choice, "dpo.on_long_pair", recipe.dpo.on_long_pair, ON_LONG_PAIR)
    if recipe.train.objective == "dpo":
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
    problems.raise_any()
