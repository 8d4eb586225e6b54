"""Per-sequence log-probabilities of the reply tokens, summed over the tokens whose label is
not IGNORE_ID, as TRL sums them (trl/trainer/dpo_trainer.py concatenated_forward:
selective_log_softmax of the shifted labels, masked, summed per row).

Under chunked CE the per-token log-probs come chunk by chunk (model/chunked_loss.py
ChunkedTokenLogProbs), so the vocabulary-wide logits of the whole batch never exist."""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

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
        targets = labels[:, 1:]  # (B, T)
        per_token = self.per_token(input_ids, targets, embeds)
        lengths = (targets != IGNORE_ID).astype(ms.float32).sum(-1)
        return per_token.sum(-1), lengths

    def with_whole_rows(self, input_ids, labels, embeds=None):
        """ORPO's: (reply sums, reply tokens, whole-row sums, whole-row tokens), (B,) each, from one
        head pass. The whole row is every token after the first up to the reply's last (prompt
        and reply, not the padding), as ORPOTrainer.concatenated_forward scores its chosen NLL
        ("computed over the full prompt and response": the attention mask's tokens)."""
        replies = labels[:, 1:]  # (B, T)
        reply = (replies != IGNORE_ID).astype(ms.float32)
        positions = ops.arange(replies.shape[1], dtype=ms.float32).reshape(1, -1)  # (1, T)
        last = (positions * reply).max(-1, keepdims=True)  # (B, 1): the row's last reply target
        real = (positions <= last).astype(ms.float32)  # (B, T)
        targets = ops.select(real > 0, input_ids[:, 1:], ops.full_like(replies, IGNORE_ID))
        per_token = self.per_token(input_ids, targets, embeds)
        return (per_token * reply).sum(-1), reply.sum(-1), per_token.sum(-1), real.sum(-1)

    def per_token(self, input_ids, targets, embeds):
        """(B, T) log-probs of `targets` (0 where IGNORE_ID) after input_ids[:, :-1]."""
        tokens = input_ids[:, :-1]  # (B, T)
        if embeds is None:
            embeds = self.backbone.tok_embeddings(tokens)
        hidden = self.backbone(tokens, input_embeds=embeds)
        return self.head_loss(hidden.reshape(-1, self.hidden_size), targets.reshape(-1)).reshape(targets.shape)


class WholeRowMeans(nn.Cell):
    """(input_ids, labels) -> ((B,) mean log-prob of each row's whole tokens,): ORPO's chosen
    NLL (negated) for eval, through reference_pass.reference_log_probs' batching."""

    def __init__(self, sequences: SequenceLogProbs):
        super().__init__(auto_prefix=False)
        self.sequences = sequences

    def construct(self, input_ids, labels):
        _, _, whole, count = self.sequences.with_whole_rows(input_ids, labels)
        return (whole / ops.maximum(count, 1.0),)
