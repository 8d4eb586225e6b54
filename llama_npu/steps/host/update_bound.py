"""How far the host's AdamW step may land from the graph's, derived from fp32 rounding.

The host step (steps/host/step.py) and the in-graph step (steps/graph_step.py) take one
optimizer step from the same state (fp32 masters w, moments m, v; the same float16 card
weights, so the same float16 gradients, accumulated in fp32 in the same order). Two things
differ, and nothing else:

1. The clip factor f = clip / (norm + 1e-6) / scale. Each side sums the squares of 8M
   gradients in its own order (BLAS on the card or the CPU, torch or numba on the host), so
   the two norms differ in their last bits; rho, the relative difference of the two factors,
   is read off the two reported norms (clip_factor_difference). Every gradient g = f G moves
   with it: m' by (1 - b1) g rho, v' by 2 (1 - b2) g^2 rho, and r = m' / (sqrt(v') + eps) by
   rho ((1 - b1) |g| / D + |r| (1 - b2) g^2 / (sqrt(v') D)), D = sqrt(v') + eps.
2. The rounding of the update itself. MindSpore's AdamWeightDecay kernel and the host's
   kernel evaluate m' = b1 m + (1 - b1) g, v' = b2 v + (1 - b2) g^2 and
   w' = w - lr (r + wd w) in fp32 in different orders (torch's fused kernel even through
   bias-corrected constants, steps/host/optimizer.py). Each result is within a few units
   of roundoff u = 2^-24 of the exact one, counted operation by operation (first order):
   m': two products, one sum, and 1 - b1 formed in fp32 from fp32(b1) (4u relative, as
       MindSpore forms it): 7u of b1 |m| + (1 - b1) |g|;
   v': one square, two products, one sum, 1 - b2 likewise: 8u of v';
   r:  m''s error over D, plus |r| times half v''s relative error, and a sqrt, the eps add,
       the division and torch's rescaled lr and eps: 7u;
   w': lr r, wd w, their sum, lr times it, the subtraction: 5u of |w| + |w'| + lr |r| + lr wd |w|.
   The two sides' errors add: twice each.

The card's float16 weights are the masters rounded to float16. Two masters this close round to
the same float16 value unless a rounding midpoint lies between them, and then to neighbouring
values: a weight one float16 step apart is the only difference the card may see. Its effect
is chaotic (the next forward rounds differently in float16 wherever it reaches), which is why
a comparison over several free-running steps has no bound from arithmetic and one step from a
shared state has; tests/test_offload.py and selftest's host_optimizer compare step by step.

The losses of one step from the same weights are the same per-token values summed in another
order: a tree of at most n + k additions (n the micro-batch's most target tokens, k micro-batches),
each side within (n + k) u of the exact sum of non-negative terms (loss_difference_bound).
"""
from __future__ import annotations

import numpy as np

from ...recipe.schema import OptimizerSection

U = 2.0 ** -24  # fp32 unit roundoff


def clip_factor_difference(norm_a: float, norm_b: float, grad_clip: float) -> float:
    """rho: the relative difference of the two sides' unscale-and-clip factors. Clipping,
    each factor is clip / (norm + 1e-6) / scale, so the norms' difference carries over;
    not clipping, it is 1 / scale on both (a power of two). 4u: forming each factor."""
    clipping = grad_clip > 0 and max(norm_a, norm_b) > grad_clip
    return (abs(norm_a - norm_b) / (min(norm_a, norm_b) + 1e-6) if clipping else 0.0) + 4 * U


def adamw_difference_bound(before: tuple, after: tuple, lr: float, section: OptimizerSection,
                           decayed: bool, rho: float) -> tuple:
    """Elementwise bounds (w, m, v) on |host - graph| after one AdamW step from `before`
    = (w, m, v), given the graph's `after` = (w', m', v') (fp32 arrays of one tensor), the
    step's learning rate, whether the tensor is decayed (matrices), and rho (see the module)."""
    b1, b2, eps = section.beta1, section.beta2, section.eps
    wd = section.weight_decay if decayed else 0.0
    w0, m0, _ = (np.abs(np.asarray(x, np.float64)) for x in before)
    w1, m1, v1 = (np.asarray(x, np.float64) for x in after)
    g = np.abs(m1 - b1 * np.asarray(before[1], np.float64)) / (1 - b1)  # the graph's applied |gradient|
    root = np.sqrt(v1)
    d = root + eps
    r = np.abs(m1) / d
    err_m = 7 * U * (b1 * m0 + (1 - b1) * g)
    err_v = 8 * U * v1
    half_v = np.divide(err_v, 2 * v1, out=np.zeros_like(v1), where=v1 > 0) * root / d
    err_r = err_m / d + r * (half_v + 7 * U)
    err_w = lr * err_r + 5 * U * (w0 + np.abs(w1) + lr * r + lr * wd * w0)
    moved_r = rho * ((1 - b1) * g / d + np.divide(r * (1 - b2) * g * g, root * d, out=np.zeros_like(v1),
                                                  where=root > 0))
    return (2 * err_w + lr * moved_r, 2 * err_m + rho * (1 - b1) * g, 2 * err_v + 2 * rho * (1 - b2) * g * g)


def loss_difference_bound(loss: float, most_tokens: int, micro_batches: int) -> float:
    """|host - graph| of a step's mean loss from the same weights (the module's last paragraph)."""
    return 2 * (most_tokens + micro_batches) * U * abs(loss)


def float16_neighbours(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Where two float16 arrays differ, whether by exactly one float16 step (the same sign)."""
    ia, ib = (np.asarray(x, np.float16).view(np.int16).astype(np.int32) for x in (a, b))
    return (ia == ib) | ((np.abs(ia - ib) == 1) & ((ia < 0) == (ib < 0)))
