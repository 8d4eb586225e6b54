"""The preference losses of TRL 0.24.0, in MindSpore ops, and the loss cell of a DPO step.

Followed: trl/trainer/dpo_trainer.py DPOTrainer.dpo_loss (sigmoid with label smoothing, ipo)
and concatenated_forward (ipo's log-probs divided by the reply length);
trl/trainer/cpo_trainer.py CPOTrainer.cpo_loss (simpo: the length-averaged log-probs of
get_batch_logps(average_log_prob=True), the margin gamma / beta);
trl/trainer/orpo_trainer.py ORPOTrainer.odds_ratio_loss and get_batch_loss_metrics (orpo:
the chosen row's NLL minus lambda x log sigmoid of the log odds ratio of the length-averaged
log-probs; TRL's `beta` is lambda). log sigmoid(x) is -softplus(-x). A batch holds 2P rows:
the P chosen replies, then the P rejected ones (TRL's concatenated order), so a pair's two
rows run in one forward pass; the sharded step interleaves them instead, each pair's chosen
row then its rejected row (InterleavedPairs).
"""
from __future__ import annotations

import numpy as np

import mindspore as ms
from mindspore import Parameter, nn, ops
from mindspore.ops import operations as P

from ..adapters_off import AdaptersOffReference, install_adapter_switch
from ..sequence_logps import SequenceLogProbs
from .section import LENGTH_NORMALISED


class PairLoss(nn.Cell):
    """(chosen, rejected, ref_chosen, ref_rejected[, chosen_nll]) log-probs, each (P,), already
    length-normalised where the loss is -> (losses, chosen rewards, rejected rewards, extra),
    each (P,); `extra` is () but for orpo: (chosen NLL, log sigmoid(log odds), log odds)."""

    def __init__(self, section):
        super().__init__()
        self.loss, self.beta = section.loss, float(section.beta)
        self.smoothing, self.gamma = float(section.label_smoothing), float(section.simpo_gamma)
        self.orpo_lambda = float(section.orpo_lambda)

    def construct(self, chosen, rejected, ref_chosen, ref_rejected, chosen_nll=None):
        if self.loss == "orpo":
            return self.odds_ratio(chosen, rejected, chosen_nll)
        if self.loss == "simpo":
            logits = (chosen - rejected) - self.gamma / self.beta
            ref_chosen, ref_rejected = ops.zeros_like(chosen), ops.zeros_like(rejected)
        else:
            logits = (chosen - rejected) - (ref_chosen - ref_rejected)
        if self.loss == "ipo":
            losses = ops.square(logits - 1.0 / (2.0 * self.beta))
        else:  # sigmoid, simpo: -log sigmoid(beta x) (1 - ls) - log sigmoid(-beta x) ls
            scaled = self.beta * logits
            losses = ops.softplus(-scaled) * (1.0 - self.smoothing) + ops.softplus(scaled) * self.smoothing
        chosen_rewards = ops.stop_gradient(self.beta * (chosen - ref_chosen))
        rejected_rewards = ops.stop_gradient(self.beta * (rejected - ref_rejected))
        return losses, chosen_rewards, rejected_rewards, ()

    def odds_ratio(self, chosen, rejected, chosen_nll):
        """ORPOTrainer.odds_ratio_loss; the pair's loss is get_batch_loss_metrics' nll - lambda x ratio."""
        log_odds = (chosen - rejected) - (ops.log1p(-ops.exp(chosen)) - ops.log1p(-ops.exp(rejected)))
        ratio = -ops.softplus(-log_odds)  # log sigmoid(log_odds)
        losses = chosen_nll - self.orpo_lambda * ratio
        chosen_rewards = ops.stop_gradient(self.orpo_lambda * chosen)
        rejected_rewards = ops.stop_gradient(self.orpo_lambda * rejected)
        return losses, chosen_rewards, rejected_rewards, (ops.stop_gradient(chosen_nll), ops.stop_gradient(ratio),
                                                          ops.stop_gradient(log_odds))


class ConcatenatedPairs(nn.Cell):
    """(2P,) per-row values in TRL's concatenated order (P chosen rows, then P rejected) ->
    (chosen (P,), rejected (P,))."""

    def construct(self, rows):
        pairs = rows.shape[0] // 2
        return rows[:pairs], rows[pairs:]


class InterleavedPairs(nn.Cell):
    """(2P,) per-row values in the sharded step's order (each pair's chosen row, then its
    rejected row; sharded.py says why) -> (chosen (P,), rejected (P,)).
    A data-parallel shard holds whole pairs, so the split is a reshape to (P, 2) that keeps
    the batch axis split as it was and a slice of the pair axis, which is not split: the
    (dp, 1) strategies MindFormers gives its own slices of the batch (llama.py)."""

    def __init__(self, data_parallel: int):
        super().__init__()
        self.reshape = P.Reshape()
        self.slice = P.StridedSlice().shard(((data_parallel, 1),))

    def construct(self, rows):
        pairs = rows.shape[0] // 2
        both = self.reshape(rows, (pairs, 2))
        chosen = self.reshape(self.slice(both, (0, 0), (pairs, 1), (1, 1)), (pairs,))
        rejected = self.reshape(self.slice(both, (0, 1), (pairs, 2), (1, 1)), (pairs,))
        return chosen, rejected


class PreferenceLoss(nn.Cell):
    """(input_ids, labels, reference[, embeds]) -> the losses of the batch's P pairs, summed
    (the step divides by the pairs of the whole optimizer step, as it divides the SFT loss by
    its tokens). `reference`: (2P,) the reference's summed reply log-probs of the same rows
    (zeros under dpo.reference none; under adapters_off ignored: the graph computes them,
    objectives/adapters_off.py). `terms` gives every per-pair quantity the metrics need;
    each forward also adds its pairs' metric sums (pair_metrics) into `metric_sums`, which the
    host reads and zeroes once an optimizer step (take_metrics): no second forward for them.
    `data_parallel`: the rows are interleaved pairs split over that many cards (the sharded
    step's order); None: TRL's concatenated order."""

    def __init__(self, llama, section, chunk_size: int | None = None, data_parallel: int | None = None):
        super().__init__(auto_prefix=False)
        self.sequences = SequenceLogProbs(llama, chunk_size)
        self.backbone = self.sequences.backbone  # the train step looks the embedding up here
        self.pair_loss = PairLoss(section)
        self.split = ConcatenatedPairs() if data_parallel is None else InterleavedPairs(data_parallel)
        self.normalised = section.loss in LENGTH_NORMALISED
        self.orpo = section.loss == "orpo"
        self.adapters_off = section.reference == "adapters_off"
        if self.adapters_off:
            self.reference_cell = AdaptersOffReference(self.sequences, install_adapter_switch(llama))
        self.metric_names = metric_names(section.loss)
        self.metric_sums = Parameter(np.zeros(len(self.metric_names), np.float32), name="dpo_metric_sums",
                                     requires_grad=False)

    def construct(self, input_ids, labels, reference, embeds=None):
        losses, *rest = self.terms(input_ids, labels, reference, embeds)
        added = ops.assign_add(self.metric_sums, pair_metrics(*rest))
        return ops.depend(losses.sum(), added)

    def take_metrics(self, pairs: int) -> dict:
        """The means over the `pairs` summed since the last call, by TRL's names; zeroes the sums."""
        sums = self.metric_sums.asnumpy()
        self.metric_sums.set_data(ms.Tensor(np.zeros_like(sums)))
        return {name: float(value) / max(pairs, 1) for name, value in zip(self.metric_names, sums)}

    def terms(self, input_ids, labels, reference, embeds=None):
        """(losses, chosen rewards, rejected rewards, chosen log-probs, rejected log-probs, *orpo's
        (chosen NLL, log sigmoid(log odds), log odds)), (P,) each."""
        if self.adapters_off:  # before the policy forward, which reads input_ids once the adapters are back on
            reference = self.reference_cell(input_ids, labels)
            input_ids = ops.depend(input_ids, reference)
        chosen_nll = None
        if self.orpo:
            policy, lengths, whole, whole_count = self.sequences.with_whole_rows(input_ids, labels, embeds)
            chosen_nll = -self.split(whole)[0] / ops.maximum(self.split(whole_count)[0], 1.0)
        else:
            policy, lengths = self.sequences(input_ids, labels, embeds)
        if self.normalised:
            policy, reference = policy / lengths, reference / lengths
        (chosen, rejected), (ref_chosen, ref_rejected) = self.split(policy), self.split(reference)
        losses, chosen_rewards, rejected_rewards, extra = self.pair_loss(chosen, rejected, ref_chosen, ref_rejected,
                                                                         chosen_nll)
        return (losses, chosen_rewards, rejected_rewards, chosen, rejected) + extra


def pair_metrics(chosen_rewards, rejected_rewards, chosen, rejected, *extra):
    """TRL's metric names (dpo_trainer.py get_batch_loss_metrics; orpo_trainer.py's adds
    nll_loss, log_odds_ratio and log_odds_chosen), summed over the pairs, (6,) or (9,)."""
    return ops.stack([chosen_rewards.sum(), rejected_rewards.sum(),
                      (chosen_rewards > rejected_rewards).astype(ms.float32).sum(),
                      (chosen_rewards - rejected_rewards).sum(),
                      ops.stop_gradient(chosen).sum(), ops.stop_gradient(rejected).sum()]
                     + [ops.stop_gradient(t).sum() for t in extra])


METRIC_NAMES = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
                "logps/chosen", "logps/rejected")
# ORPOTrainer's own: the chosen rows' NLL, mean log sigmoid(log odds), mean log odds.
ORPO_METRIC_NAMES = ("nll_loss", "log_odds_ratio", "log_odds_chosen")


def metric_names(loss: str) -> tuple:
    return METRIC_NAMES + (ORPO_METRIC_NAMES if loss == "orpo" else ())
