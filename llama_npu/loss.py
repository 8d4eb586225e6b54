"""Next-token cross-entropy summed over target tokens.

The loss cell returns a sum, not a mean: the training step divides by the number of target
tokens of the whole optimizer step, so micro-batches with much padding weigh what their
tokens weigh.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from .model import IGNORE_ID


def token_cross_entropy_sum(logits, targets):
    """Sum of -log softmax(logits)[target] over rows whose target is not IGNORE_ID.
    logits (N, V) fp32, targets (N,) int32."""
    mask = (targets != IGNORE_ID).astype(ms.float32)
    safe_targets = ops.maximum(targets, 0).reshape(-1, 1)
    picked = ops.gather_elements(logits, 1, safe_targets).reshape(-1)
    return ((ops.logsumexp(logits, -1) - picked) * mask).sum()


class FullHeadLoss(nn.Cell):
    """LM head and loss over all tokens at once: (N, vocab) fp32 logits exist in full."""

    def __init__(self, lm_head):
        super().__init__(auto_prefix=False)
        self.lm_head = lm_head

    def construct(self, hidden, targets):
        logits = self.lm_head(hidden).astype(ms.float32)  # (N, V)
        return token_cross_entropy_sum(logits, targets)


class CausalLMLoss(nn.Cell):
    """(input_ids, labels), both (B, T+1) -> summed loss of predicting position t+1 from <= t."""

    def __init__(self, llama, head_loss=None):
        # auto_prefix=False keeps MindFormers' parameter names (model.layers.0...) in
        # checkpoints, so they load into a plain LlamaForCausalLM.
        super().__init__(auto_prefix=False)
        self.backbone = llama.model
        self.head_loss = head_loss if head_loss is not None else FullHeadLoss(llama.lm_head)
        self.hidden_size = llama.config.hidden_size

    def construct(self, input_ids, labels):
        tokens = input_ids[:, :-1]  # (B, T)
        targets = labels[:, 1:].reshape(-1)  # (B*T,)
        hidden = self.backbone(tokens).reshape(-1, self.hidden_size)  # (B*T, H)
        return self.head_loss(hidden, targets)
