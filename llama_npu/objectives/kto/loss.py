"""TRL 0.24.0's KTO loss in MindSpore ops, the loss cell of a KTO step and the KL pass before it.

Followed: trl/trainer/kto_trainer.py KTOTrainer.kto_loss (loss_type "kto": a desirable
reply's loss 1 - sigmoid(beta (log-ratio - KL)), an undesirable one's 1 - sigmoid(beta (KL -
log-ratio)), weighed by desirable_weight / undesirable_weight; rewards beta x log-ratio,
detached), _compute_kl_logps (the policy's log-probs of the KL rows under no_grad) and
get_batch_loss_metrics (the loss is the mean over the batch's replies; metrics by TRL's names).
The KL estimate is the mean of (policy - reference) log-probs of the KL rows, detached,
averaged over the ranks and clamped at 0: here once an optimizer step, over the step's
records, by the KL pass (KlLogRatios, run by kl_estimate.py) before the step's first
micro-batch; each micro-batch then reads it from its `extra` array.
"""
from __future__ import annotations

import numpy as np

import mindspore as ms
from mindspore import Parameter, nn, ops

from ..adapters_off import AdaptersOffReference, install_adapter_switch
from ..sequence_logps import SequenceLogProbs
from .replies import DESIRABLE, KL, REFERENCE


class KtoTerms(nn.Cell):
    """(policy log-probs, reference log-probs, desirable (1.0 / 0.0), KL), each (B,) -> (losses
    (B,) weighed, rewards (B,) detached)."""

    def __init__(self, section):
        super().__init__()
        self.beta = float(section.beta)
        self.desirable_weight, self.undesirable_weight = float(section.desirable_weight), float(
            section.undesirable_weight)

    def construct(self, policy, reference, desirable, kl):
        log_ratios = policy - reference
        chosen = self.desirable_weight * (1.0 - ops.sigmoid(self.beta * (log_ratios - kl)))
        rejected = self.undesirable_weight * (1.0 - ops.sigmoid(self.beta * (kl - log_ratios)))
        losses = ops.select(desirable > 0.5, chosen, rejected)
        return losses, ops.stop_gradient(self.beta * log_ratios)


def adapter_switch(llama, section):
    """The shared LoRA scaling switch under kto.reference adapters_off (objectives/adapters_off.py), else None."""
    return install_adapter_switch(llama) if section.reference == "adapters_off" else None


class KtoLoss(nn.Cell):
    """(input_ids, labels, extra[, embeds]) -> the summed losses of the micro-batch's B replies
    (the step divides by the replies of the whole optimizer step, as TRL's nanmean does over a
    batch). `extra` (B, 4): replies.py's columns; the reference column is
    ignored under adapters_off (the graph computes it). Each forward adds its metric sums
    (count, rewards, log-probs of each side) into `metric_sums`, which the host reads and
    zeroes once an optimizer step (take_metrics)."""

    def __init__(self, llama, section, chunk_size: int | None = None, switch: Parameter | None = None):
        super().__init__(auto_prefix=False)
        self.sequences = SequenceLogProbs(llama, chunk_size)
        self.backbone = self.sequences.backbone  # the train step looks the embedding up here
        self.terms_cell = KtoTerms(section)
        self.reference_cell = None if switch is None else AdaptersOffReference(self.sequences, switch)
        self.metric_sums = Parameter(np.zeros(6, np.float32), name="kto_metric_sums", requires_grad=False)

    def construct(self, input_ids, labels, extra, embeds=None):
        losses, rewards, policy, desirable = self.terms(input_ids, labels, extra, embeds)
        added = ops.assign_add(self.metric_sums, side_sums(rewards, policy, desirable))
        return ops.depend(losses.sum(), added)

    def terms(self, input_ids, labels, extra, embeds=None):
        """(losses, rewards, policy log-probs, desirable), (B,) each."""
        reference = extra[:, REFERENCE]
        if self.reference_cell is not None:  # before the policy forward, which reads input_ids once the adapters are on
            reference = self.reference_cell(input_ids, labels)
            input_ids = ops.depend(input_ids, reference)
        policy, _ = self.sequences(input_ids, labels, embeds)
        desirable = extra[:, DESIRABLE]
        losses, rewards = self.terms_cell(policy, reference, desirable, extra[:, KL])
        return losses, rewards, policy, desirable

    def take_metrics(self, kl: float) -> dict:
        """The step's metrics by TRL's names, from the sums since the last call (zeroed)."""
        sums = self.metric_sums.asnumpy()
        self.metric_sums.set_data(ms.Tensor(np.zeros_like(sums)))
        return side_metrics(sums, kl)


def side_sums(rewards, policy, desirable):
    """(6,): desirable and undesirable replies' counts, summed rewards and summed log-probs."""
    undesirable = 1.0 - desirable
    policy = ops.stop_gradient(policy)
    return ops.stack([desirable.sum(), undesirable.sum(), (rewards * desirable).sum(), (rewards * undesirable).sum(),
                      (policy * desirable).sum(), (policy * undesirable).sum()])


def side_metrics(sums, kl: float) -> dict:
    """TRL's logged names (KTOTrainer.log: each side's sums over its count, rewards/margins
    when both sides are present; a side absent from the step is left out, as TRL leaves it).
    TRL's logits/chosen and logits/rejected (the sum of every vocabulary logit) are not kept:
    chunked CE never holds the whole logits, and their value depends on the padding."""
    metrics = {"kl": float(kl)}
    for side, count, reward, logp in (("chosen", sums[0], sums[2], sums[4]), ("rejected", sums[1], sums[3], sums[5])):
        if count > 0:
            metrics[f"rewards/{side}"], metrics[f"logps/{side}"] = float(reward / count), float(logp / count)
    if "rewards/chosen" in metrics and "rewards/rejected" in metrics:
        metrics["rewards/margins"] = metrics["rewards/chosen"] - metrics["rewards/rejected"]
    return metrics


class KlLogRatios(nn.Cell):
    """(KL ids, KL labels, reference (B,)) -> (B,) the policy's minus the reference's summed
    reply log-probs of the KL rows, without gradient (TRL's _compute_kl_logps under no_grad);
    under adapters_off the reference is computed here, with the adapters off, and the
    `reference` input is ignored."""

    def __init__(self, llama, chunk_size: int | None = None, switch: Parameter | None = None):
        super().__init__(auto_prefix=False)
        self.sequences = SequenceLogProbs(llama, chunk_size)
        self.reference_cell = None if switch is None else AdaptersOffReference(self.sequences, switch)

    def construct(self, input_ids, labels, reference):
        if self.reference_cell is not None:
            reference = self.reference_cell(input_ids, labels)
            input_ids = ops.depend(input_ids, reference)
        policy, _ = self.sequences(input_ids, labels)
        return ops.stop_gradient(policy - reference)
