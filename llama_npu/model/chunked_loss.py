"""Chunked cross-entropy cells: the LM head and the loss computed `chunk_size` tokens at a time.

With Llama 3.2's 128,256-token vocabulary the fp32 logits of one 4,096-token micro-batch
are 2.1 GB, and autodiff would keep them (and the softmax) alive until the backward pass.
Here the forward pass sums chunk losses, and a custom backward recomputes each chunk's
logits and applies d loss / d logits = softmax - onehot chunk by chunk, so at most one
chunk of logits exists at a time. The price is one extra head matmul per chunk (the
recompute). Loss and gradients equal the full path (tests/test_strategies.py).
"""
from __future__ import annotations

import mindspore as ms
from mindspore import Tensor, nn, ops

from .loss import token_log_probs
from .tokens import IGNORE_ID


VOCAB_BLOCK = 8192  # head rows cast at a time: 8,192 x 2,048 fp32 is 67 MB (the whole 1B head: 1.05 GB)


class ChunkedTokenLogProbs(nn.Cell):
    """(hidden (N, H), weight (V, H), targets (N,)) -> (N,) log-probs of the targets (0 where
    IGNORE_ID), chunked in both passes: the per-token form that preference objectives sum per
    sequence (objectives/sequence_logps.py) and cross-entropy sums over the batch. `weight` is
    the head's weight as held; the head computes in the hidden states' dtype, as MindFormers'
    Linear does (mindformers/modules/layers.py Linear.construct casts its weight)."""

    def __init__(self, chunk_size: int):
        super().__init__()
        self.chunk_size = chunk_size
        self.head = ops.MatMul(transpose_b=True)  # reads the weight as stored: no transposed copy

    def logits(self, hidden, weight):
        """(C, H) x (V, H) in the compute dtype -> (C, V) fp32 logits."""
        return self.head(hidden, weight).astype(ms.float32)

    def blockwise_log_probs(self, hidden, weight, targets):
        """token_log_probs of a head held in another dtype than the hidden states (eval's fp16-
        and int8-held models compute in fp32), VOCAB_BLOCK head rows at a time, each cast as it is
        used, the log-sum-exp carried across blocks rescaled to the running maximum: neither a
        compute-dtype copy of the whole head (1.05 GB for the 1B's fp16 head, every chunk) nor a
        chunk's full-vocabulary logits exist at once where the backend frees a kernel's buffers
        (PyNative; benchmarks/int8_memory.py). Equal to token_log_probs within fp32 rounding
        (the order of the sums); the backward (bprop) recomputes whole logits rows as before."""
        safe = ops.maximum(targets, 0)
        peak, sum_exp, picked = None, None, None
        for start in range(0, weight.shape[0], VOCAB_BLOCK):
            logits = self.logits(hidden, weight[start:start + VOCAB_BLOCK].astype(hidden.dtype))  # (C, B)
            width = logits.shape[1]
            inside = ops.logical_and(safe >= start, safe < start + width)
            column = ops.clip(safe - start, 0, width - 1).reshape(-1, 1)
            here = ops.gather_elements(logits, 1, column).reshape(-1) * inside.astype(ms.float32)
            block_peak = logits.max(-1, keepdims=True)  # (C, 1)
            if peak is None:
                peak, picked = block_peak, here
                sum_exp = ops.exp(logits - peak).sum(-1)
            else:
                new_peak = ops.maximum(peak, block_peak)
                sum_exp = sum_exp * ops.exp(peak - new_peak).reshape(-1) + ops.exp(logits - new_peak).sum(-1)
                peak, picked = new_peak, picked + here
        mask = (targets != IGNORE_ID).astype(ms.float32)
        return (picked - (ops.log(sum_exp) + peak.reshape(-1))) * mask

    def construct(self, hidden, weight, targets):
        pieces = ()
        for start in range(0, hidden.shape[0], self.chunk_size):
            end = start + self.chunk_size
            if weight.dtype == hidden.dtype:
                log_probs = token_log_probs(self.logits(hidden[start:end], weight), targets[start:end])
            else:
                log_probs = self.blockwise_log_probs(hidden[start:end], weight, targets[start:end])
            pieces += (log_probs,)
        return ops.concat(pieces, 0)

    def bprop(self, hidden, weight, targets, out, dout):
        """d log p(target) / d logits = onehot - softmax, times each token's own dout (N,)."""
        one, zero = Tensor(1.0, ms.float32), Tensor(0.0, ms.float32)
        computing = weight.astype(hidden.dtype)  # the backward needs the whole matrix for d_hidden
        d_hidden = ()
        d_weight = ops.zeros(weight.shape, ms.float32)
        for start in range(0, hidden.shape[0], self.chunk_size):
            end = start + self.chunk_size
            h, t = hidden[start:end], targets[start:end]
            logits = self.logits(h, computing)  # recomputed, (C, V)
            onehot = ops.one_hot(ops.maximum(t, 0), logits.shape[-1], one, zero)
            scale = ((t != IGNORE_ID).astype(ms.float32) * dout[start:end]).reshape(-1, 1)
            d_logits = ((onehot - ops.softmax(logits, -1)) * scale).astype(hidden.dtype)
            d_hidden += (ops.matmul(d_logits, computing),)
            d_weight = d_weight + ops.matmul(d_logits.T, h).astype(ms.float32)
        # Through the compute dtype, as autodiff of the head's cast would round it (FullHeadLoss).
        d_weight = d_weight.astype(hidden.dtype).astype(weight.dtype)
        return ops.concat(d_hidden, 0), d_weight, ops.zeros_like(targets)


class ChunkedHeadLogProbs(nn.Cell):
    """(hidden (N, H), targets (N,)) -> (N,) per-token log-probs of `lm_head`, at most
    `chunk_size` rows of logits at a time."""

    def __init__(self, lm_head, chunk_size: int):
        super().__init__(auto_prefix=False)
        self.lm_head = lm_head
        self.log_probs = ChunkedTokenLogProbs(chunk_size)

    def construct(self, hidden, targets):
        return self.log_probs(hidden, self.lm_head.weight, targets)


class ChunkedHeadLoss(ChunkedHeadLogProbs):
    """Drop-in for loss.FullHeadLoss: the summed cross-entropy."""

    def construct(self, hidden, targets):
        return -self.log_probs(hidden, self.lm_head.weight, targets).sum()
