"""The host optimizer's kernels (steps/host/optimizer.py), compiled by numba for this CPU:
the fused AdamW update and the additions into the fp32 gradient accumulators, each one
parallel pass over flat fp32 arrays. numba and llvmlite install from the package index as
CPU-only wheels on x86_64 and aarch64 (the offload extra), where torch's wheels there are
CUDA builds that pull several GB of CUDA packages.

Compiling: cache=True keeps each kernel's machine code under __pycache__ beside this file
(numba's user-wide cache directory where that is read-only). The first call after an install
compiles the kernel for its argument types, 1-3 s each on a 2-core x86_64 (about 10 s for all
of them; measured), and every later process loads the cache in milliseconds.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

@njit(parallel=True, cache=True)
def adamw(w, g, m, v, lr, beta1, beta2, eps, decay, scale):
    """MindSpore's AdamWeightDecay on flat fp32 arrays, in place, with g * scale the
    gradient, every operation in fp32 in the order of MindSpore's CPU kernel
    (nnacl/fp32/adam_fp32.c AdamWeightDecayFp32): m += (g - m)(1 - b1);
    v += (g g - v)(1 - b2); w -= lr (m / (sqrt(v) + eps) + decay w)."""
    one = np.float32(1.0)
    lr, beta1_minus, beta2_minus = np.float32(lr), one - np.float32(beta1), one - np.float32(beta2)
    eps, decay, scale = np.float32(eps), np.float32(decay), np.float32(scale)
    for i in prange(w.size):
        grad = g[i] * scale
        moment1 = m[i] + (grad - m[i]) * beta1_minus
        moment2 = v[i] + (grad * grad - v[i]) * beta2_minus
        m[i] = moment1
        v[i] = moment2
        w[i] = w[i] - lr * (moment1 / (np.sqrt(moment2) + eps) + decay * w[i])


@njit(parallel=True, cache=True)
def add_float32(acc, values):
    for i in prange(acc.size):
        acc[i] += values[i]


@njit(parallel=True, cache=True)
def add_bfloat16(acc, bits):
    """bfloat16 as its uint16 bits: the upper half of the float32 with the same value."""
    for i in prange(acc.size):
        acc[i] += np.uint32(np.uint32(bits[i]) << np.uint32(16)).view(np.float32)


@njit(cache=True)
def _float16_value(bits):
    """An IEEE half's uint16 bits as the float32 of the same value (exact: numba has no
    float16 on the CPU)."""
    sign = np.uint32(bits >> 15) << np.uint32(31)
    exponent = np.uint32((bits >> 10) & 0x1F)
    mantissa = np.uint32(bits & 0x3FF)
    if exponent == 0:  # zero and subnormals: mantissa x 2^-24, exact in float32
        value = np.float32(mantissa) * np.float32(2.0 ** -24)
        return -value if sign else value
    widened = np.uint32(255) if exponent == 31 else exponent + np.uint32(112)  # inf, nan; else rebias 15 -> 127
    # numba widens uint32 arithmetic to 64 bits: back to 32 before the bits are read as a float32
    return np.uint32(sign | (widened << np.uint32(23)) | (mantissa << np.uint32(13))).view(np.float32)


@njit(parallel=True, cache=True)
def add_float16(acc, bits):
    for i in prange(acc.size):
        acc[i] += _float16_value(bits[i])


@njit(cache=True)
def add_rows(table, tokens, rows):
    """table[tokens[r]] += rows[r] for each r in order (fp32): one thread, so that a token
    seen twice adds its rows in their order, as torch's index_add_ and the graph's
    scatter-add do on the CPU."""
    for r in range(tokens.size):
        table[tokens[r]] += rows[r]


def accumulate(acc: np.ndarray, values: np.ndarray) -> None:
    """acc += values, `values` a card output as numpy: float32, float16, or ml_dtypes'
    bfloat16 (which is how MindSpore hands out bfloat16 tensors)."""
    flat = values.reshape(-1)
    if flat.dtype == np.float32:
        add_float32(acc, flat)
    elif flat.dtype == np.float16:
        add_float16(acc, flat.view(np.uint16))
    elif flat.dtype.name == "bfloat16":
        add_bfloat16(acc, flat.view(np.uint16))
    else:
        raise TypeError(f"host accumulation of {flat.dtype} gradients: expected float32, float16 or bfloat16")
