"""Next-token cross-entropy summed over target tokens.

The loss cell returns a sum, not a mean: the training step divides by the number of target
tokens of the whole optimizer step, so micro-batches with much padding weigh what their
tokens weigh.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from .tokens import IGNORE_ID


def token_log_probs(logits, targets):
    """log softmax(logits)[target] of each row, 0 where the target is IGNORE_ID.
    logits (N, V) fp32, targets (N,) int32 -> (N,) fp32."""
    mask = (targets != IGNORE_ID).astype(ms.float32)
    safe_targets = ops.maximum(targets, 0).reshape(-1, 1)
    picked = ops.gather_elements(logits, 1, safe_targets).reshape(-1)
    # log-sum-exp shifted by the row maximum for range, with the shift outside autodiff: the
    # gradient is softmax(logits) whatever the shift, and ops.logsumexp's would also run the
    # maximum's backward (an Equal mask over every logit, then a Mul and a Cast): 3.6x the time
    # of this form at 256 x 128,256 logits on the CPU backend (forward and backward).
    peak = ops.stop_gradient(logits.max(-1, keepdims=True))
    log_sum_exp = ops.log(ops.exp(logits - peak).sum(-1)) + peak.reshape(-1)
    return (picked - log_sum_exp) * mask


def token_cross_entropy_sum(logits, targets):
    """Sum of -log softmax(logits)[target] over rows whose target is not IGNORE_ID.
    logits (N, V) fp32, targets (N,) int32."""
    return -token_log_probs(logits, targets).sum()


class FullHeadLoss(nn.Cell):
    """LM head and loss over all tokens at once: (N, vocab) fp32 logits exist in full."""

    def __init__(self, lm_head):
        super().__init__(auto_prefix=False)
        self.lm_head = lm_head

    def construct(self, hidden, targets):
        logits = self.lm_head(hidden).astype(ms.float32)  # (N, V)
        return token_cross_entropy_sum(logits, targets)


class CausalLMLoss(nn.Cell):
    """(input_ids, labels[, segment_ids]), each (B, T+1) -> summed loss of predicting
    position t+1 from positions <= t. With segment_ids (packed rows) a token attends only
    to earlier tokens of its own segment."""

    def __init__(self, llama, head_loss=None):
        # auto_prefix=False keeps MindFormers' parameter names (model.layers.0...) in
        # checkpoints, so they load into a plain LlamaForCausalLM.
        super().__init__(auto_prefix=False)
        self.backbone = llama.model
        self.head_loss = head_loss if head_loss is not None else FullHeadLoss(llama.lm_head)
        self.hidden_size = llama.config.hidden_size
        self.flash_attention = llama.config.use_flash_attention

    def construct(self, input_ids, labels, segment_ids=None, embeds=None):
        """`embeds`: the token embeddings of input_ids[:, :-1], when the caller looked them up
        (steps/graph_step.py does, to take their gradient as rows). LlamaModel takes
        them as `input_embeds` in place of its own lookup (mindformers/models/llama/llama.py
        LlamaModel.construct: it casts them to the compute dtype as it does the lookup's)."""
        tokens = input_ids[:, :-1]  # (B, T)
        targets = labels[:, 1:].reshape(-1)  # (B*T,)
        if embeds is None:
            embeds = self.backbone.tok_embeddings(tokens)
        if segment_ids is None:
            hidden = self.backbone(tokens, input_embeds=embeds)
        else:
            hidden = self.packed_backbone(tokens, segment_ids[:, :-1], embeds)
        return self.head_loss(hidden.reshape(-1, self.hidden_size), targets)  # hidden: (B*T, H)

    def packed_backbone(self, tokens, segments, embeds):
        bs, t = tokens.shape
        same = segments.reshape(bs, t, 1) == segments.reshape(bs, 1, t)
        causal = ops.tril(ops.ones((t, t), ms.int32)).astype(ms.bool_).reshape(1, t, t)
        blocked = 1 - ops.logical_and(same, causal).astype(ms.float32)  # (B, T, T), 1 = masked
        if self.flash_attention:
            # Flash attention honours a passed uint8 mask (1 = masked), MindFormers >= 1.4.
            return self.backbone(tokens, input_embeds=embeds,
                                 attention_mask=blocked.reshape(bs, 1, t, t).astype(ms.uint8))
        mask = (blocked * -10000.0).reshape(bs, 1, t, t)
        return layers_with_additive_mask(self.backbone, tokens, mask, embeds)


def layers_with_additive_mask(llama_model, tokens, mask, embeds=None, freqs=None):
    """LlamaModel's forward with an additive attention mask (0 = attend, -10000 = masked,
    (B, 1, T, T)) that it would not take: passed as `attention_mask`, LlamaModel casts any
    mask to uint8 (mindformers/models/llama/llama.py LlamaModel.construct), which flash
    attention reads as 1 = masked but the plain path *adds* to the scores
    (llama_transformer.py LLamaAttention._attn), masking nothing. So without flash attention
    the layers run here with the additive mask of the form LowerTriangularMaskWithDynamic
    builds for them (mindformers/modules/transformer/transformer.py)."""
    return run_layers(llama_model, tokens, llama_model.cast(mask, llama_model.dtype), embeds, freqs)


def run_layers(llama_model, tokens, mask, embeds=None, freqs=None):
    """LlamaModel's layers and final norm over `tokens` (B, T) with `mask` as its layers take
    it (additive in the compute dtype without flash attention, uint8 1 = masked with it) and
    the rotary `freqs` (rotary_at; positions 0..T-1 when None)."""
    bs, t = tokens.shape
    if embeds is None:
        embeds = llama_model.tok_embeddings(tokens)
    h = llama_model.cast(embeds, llama_model.dtype)
    h = llama_model.reshape(h, (bs, t, llama_model.hidden_size))  # (B, T, H)
    if freqs is None:
        freqs = llama_model.freqs_mgr(t)
    for i in range(llama_model.num_layers):
        h = llama_model.layers[i](h, freqs, mask)
    return llama_model.norm_out(h)


def rotary_at(llama_model, positions):
    """The rotary embedding's (cos, sin, swap mask) at `positions` (B, T) int32, in the layout
    LlamaModel's FreqsMgr gives its layers ((1, 1, T, D) there, (B, 1, T, D) here; the rotary
    embedding broadcasts either: mindformers/modules/layers.py FreqsMgr, RotaryEmbedding)."""
    freqs = llama_model.freqs_mgr
    bs, t = positions.shape
    flat = positions.reshape(-1)
    cos = ops.gather(freqs.freqs_cos, flat, 0).reshape(bs, 1, t, -1)
    sin = ops.gather(freqs.freqs_sin, flat, 0).reshape(bs, 1, t, -1)
    return cos, sin, freqs.swap_mask
