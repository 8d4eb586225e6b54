"""train.objective: sft, supervised fine-tuning: the next-token cross-entropy of the target
tokens (model/loss.py; chunked: model/chunked_loss.py), summed over a micro-batch and divided
by the step's target tokens. It reads the SFT records of data/readers.py, tokenized, packed
or prepared (data/source.py), takes every data layout and strategy, and is `eval --data`'s
default scoring (loss and perplexity, evaluation/perplexity.py). It has no section: its keys
are the data and train sections'; every optional hook of the contract keeps its default."""
from __future__ import annotations

from ..data.readers import SFT_RECORDS
from ..model.tokens import IGNORE_ID
from .contract import Objective
from .parts import ObjectiveParts


def target_tokens(batch) -> int:
    """The tokens a micro-batch's summed SFT loss is divided by (over the whole step)."""
    return int((batch[1][:, 1:] != IGNORE_ID).sum())


class Sft(Objective):
    NAME = "sft"
    RECORDS = SFT_RECORDS

    def check(self, recipe) -> None:
        """Nothing to refuse: SFT reads every format and layout the data section and the
        strategies check."""

    def samples(self, recipe, tokenizer, records):
        """(the training source: samples, packed rows or a prepared directory; the held-out samples)."""
        from ..data.source import eval_samples, training_source  # imported here: it loads numpy, validate does not

        return training_source(recipe, tokenizer, records), eval_samples(recipe, tokenizer, records)

    def parts(self, recipe, run_dir, net, loss_cell, source, world) -> ObjectiveParts:
        """The network's own loss cell (strategies/network.py), a sum over target tokens."""
        return ObjectiveParts(loss_cell, target_tokens)

    def plan_settings(self, recipe) -> dict:
        """One row a sample, no reference: the planner's defaults."""
        return {}


OBJECTIVE = Sft()
