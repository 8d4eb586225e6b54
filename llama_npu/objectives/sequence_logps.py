"""Per-sequence log-probabilities of the reply tokens, summed over the tokens whose label is
not IGNORE_ID, as TRL sums them (trl/trainer/dpo_trainer.py concatenated_forward:
selective_log_softmax of the shifted labels, masked, summed per row).

Under chunked CE the per-token log-probs come chunk by chunk (model/chunked_loss.py
ChunkedTokenLogProbs), so the vocabulary-wide logits of the whole batch never exist."""
from __future__ import annotations

import mindspore as ms
from mindspore import nn

from ..model.chunked_loss import ChunkedHeadLogProbs
from ..model.loss import CausalLMLoss, token_log_probs
from ..model.tokens import IGNORE_ID


class FullTokenLogProbs(nn.Cell):
    """(hidden (N, H), targets (N,)) -> (N,) log-probs from the full (N, V) fp32 logits."""

    def __init__(self, lm_head):
        super().__init__(auto_prefix=False)
        self.lm_head = lm_head

    def construct(self, hidden, targets):
        return token_log_probs(self.lm_head(hidden).astype(ms.float32), targets)


def token_log_probs_cell(lm_head, chunk_size: int | None):
    return ChunkedHeadLogProbs(lm_head, chunk_size) if chunk_size else FullTokenLogProbs(lm_head)


class SequenceLogProbs(CausalLMLoss):
    """(input_ids, labels[, embeds]), each (B, T+1) -> (summed reply log-probs (B,), reply
    tokens (B,)): the backbone of CausalLMLoss with a per-token log-prob head."""

    def __init__(self, llama, chunk_size: int | None = None):
        super().__init__(llama, token_log_probs_cell(llama.lm_head, chunk_size))

    def construct(self, input_ids, labels, embeds=None):
        tokens = input_ids[:, :-1]  # (B, T)
        targets = labels[:, 1:]  # (B, T)
        if embeds is None:
            embeds = self.backbone.tok_embeddings(tokens)
        hidden = self.backbone(tokens, input_embeds=embeds)
        per_token = self.head_loss(hidden.reshape(-1, self.hidden_size), targets.reshape(-1))
        lengths = (targets != IGNORE_ID).astype(ms.float32).sum(-1)
        return per_token.reshape(targets.shape).sum(-1), lengths
