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


class ChunkedTokenLogProbs(nn.Cell):
    """(hidden (N, H), weight (V, H), targets (N,)) -> (N,) log-probs of the targets (0 where
    IGNORE_ID), chunked in both passes: the per-token form that preference objectives sum per
    sequence (objectives/sequence_logps.py) and cross-entropy sums over the batch."""

    def __init__(self, chunk_size: int):
        super().__init__()
        self.chunk_size = chunk_size

    def construct(self, hidden, weight, targets):
        pieces = ()
        for start in range(0, hidden.shape[0], self.chunk_size):
            end = start + self.chunk_size
            logits = ops.matmul(hidden[start:end], weight.T).astype(ms.float32)  # (C, V)
            pieces += (token_log_probs(logits, targets[start:end]),)
        return ops.concat(pieces, 0)

    def bprop(self, hidden, weight, targets, out, dout):
        """d log p(target) / d logits = onehot - softmax, times each token's own dout (N,)."""
        one, zero = Tensor(1.0, ms.float32), Tensor(0.0, ms.float32)
        d_hidden = ()
        d_weight = ops.zeros(weight.shape, ms.float32)
        for start in range(0, hidden.shape[0], self.chunk_size):
            end = start + self.chunk_size
            h, t = hidden[start:end], targets[start:end]
            logits = ops.matmul(h, weight.T).astype(ms.float32)  # recomputed, (C, V)
            onehot = ops.one_hot(ops.maximum(t, 0), logits.shape[-1], one, zero)
            scale = ((t != IGNORE_ID).astype(ms.float32) * dout[start:end]).reshape(-1, 1)
            d_logits = ((onehot - ops.softmax(logits, -1)) * scale).astype(hidden.dtype)
            d_hidden += (ops.matmul(d_logits, weight),)
            d_weight = d_weight + ops.matmul(d_logits.T, h).astype(ms.float32)
        return ops.concat(d_hidden, 0), d_weight.astype(weight.dtype), ops.zeros_like(targets)


class ChunkedCrossEntropy(nn.Cell):
    """(hidden (N, H), weight (V, H), targets (N,)) -> summed loss, chunked in both passes."""

    def __init__(self, chunk_size: int):
        super().__init__()
        self.log_probs = ChunkedTokenLogProbs(chunk_size)

    def construct(self, hidden, weight, targets):
        return -self.log_probs(hidden, weight, targets).sum()


class ChunkedHeadLoss(nn.Cell):
    """Drop-in for loss.FullHeadLoss."""

    def __init__(self, lm_head, chunk_size: int):
        super().__init__(auto_prefix=False)
        self.lm_head = lm_head
        self.cross_entropy = ChunkedCrossEntropy(chunk_size)

    def construct(self, hidden, targets):
        # The head runs in the compute dtype, as MindFormers' Linear does.
        weight = self.lm_head.weight.astype(hidden.dtype)
        return self.cross_entropy(hidden, weight, targets)
