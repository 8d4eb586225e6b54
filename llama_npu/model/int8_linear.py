"""The decoder's linear layers with their weight held as int8 + per-output-channel fp32 scales
(weights/quantize.py's scheme: W ~ q x s[:, None]), dequantized inside the forward, and again
inside the backward: the dequantized weight never outlives its matmul.

Two kernels do the same math:
- "dequant" (the CPU, the 910A, and any fp32 compute): cast q to fp32, multiply by s, cast to
  the compute dtype, MatMul(transpose_b=True), as MindFormers' Linear does with its float
  weight (mindformers/modules/layers.py Linear.construct). The fp32 product then the cast
  is what dequantize-at-load followed by Linear's cast computes, so the result is bit-exact.
- "wqbmm" (Atlas A2/A3, the 910B, fp16/bf16 compute): MindSpore's WeightQuantBatchMatmul
  (mindspore/ops/auto_generate/gen_ops_prim.py; the kernel is CANN's
  aclnnWeightQuantBatchMatmulV2: mindspore/include/.../weight_quant_batch_matmul_aclnn_kernel.h),
  which lists no 910A support. Its arguments and the rule CANN checks them by: model/wqbmm_arguments.py.
WeightQuantBatchMatmul has no bprop (FACTS.md), so Int8MatMul carries its own: dx = dout W.

The dequant kernel's chains (slice, cast, multiply, cast) read only Parameters. Nothing would
stop a scheduler (GE's topological sort on the 910A) from running every block's chain first
and keeping them all alive, and CSE merges identical chains (checked in the CPU IR): the
forward's with the bprop's, and DPO's adapters-off reference forward's with the policy's
(objectives/adapters_off.py), keeping the whole dequantized base alive between them. So each
block's chain starts from `ops.depend(q, previous)`: the forward's first block after x, each
next block after the previous block's matmul, the bprop's after dout. Each chain then has an
input of its own, and runs only once its matmul can.

Ascend kernels here are not exercised by CI (no NPU); the CPU runs the dequant kernel.
"""
from __future__ import annotations

import numpy as np

import mindspore as ms
from mindspore import nn, ops
from mindspore.ops.auto_generate import WeightQuantBatchMatmul

from .dequant_block import DEQUANT_BLOCK
from .llama import fused_kernels


def int8_kernel(on_ascend: bool, device_name: str, compute_dtype: str) -> str:
    """WeightQuantBatchMatmul where CANN has it and the activations are half precision (it
    takes no fp32 x): Atlas A2/A3, the same cards as FlashAttentionScore (llama.fused_kernels)."""
    half = compute_dtype in ("float16", "bfloat16")
    return "wqbmm" if half and fused_kernels(on_ascend, device_name) else "dequant"


def dequantized(q, scale, dtype):
    """q x s in fp32 (exactly tensor_files.dequantize_rows), then cast to `dtype`."""
    return ops.cast(ops.cast(q, ms.float32) * ops.expand_dims(scale, 1), dtype)


def gradient_scale(q: np.ndarray, scale: np.ndarray) -> float:
    """The largest scale of a row that is not all zeros (quantize_rows gives those 1.0): the
    910B bprop's uniform antiquant scale (Int8MatMul.backward_arguments)."""
    used = scale[np.abs(q).max(axis=1) > 0]
    return float(used.max()) if used.size else 1.0


class Int8MatMul(nn.Cell):
    """x (N, in) -> x W^T with W = q x s (out, in) formed inside the forward and the backward."""

    def __init__(self, kernel: str, compute_dtype, grad_scale: float = 1.0):
        super().__init__()
        self.kernel, self.dtype, self.grad_scale = kernel, compute_dtype, grad_scale
        self.matmul = ops.MatMul(transpose_b=True)
        self.matmul_dx = ops.MatMul()
        if kernel == "wqbmm":
            self.wqbmm = WeightQuantBatchMatmul(transpose_weight=True)
            self.wqbmm_dx = WeightQuantBatchMatmul()

    def forward_arguments(self, x, q, scale):
        """WeightQuantBatchMatmul(transpose_weight=True)'s (x, weight, antiquant_scale) for x W^T:
        the weight (n, k) = q (out, in) and the per-channel scale (n,) = s, in x's dtype.
        CANN's check on A2/A3 takes a per-channel scale of (n,) or (1, n), never (n, 1)
        (aclnn_weight_quant_batch_matmul_v2.cpp CheckAntiquantParamShape; FACTS.md), and
        MindSpore transposes the weight only, never the scale."""
        return x, q, ops.cast(scale, self.dtype)

    def backward_arguments(self, dout, q, scale):
        """WeightQuantBatchMatmul(transpose_weight=False)'s arguments for dx = dout W = (dout x s) q.
        The kernel scales along n (here `in`), not along the contracted `out`, so the rows'
        scales go onto dout. Multiplying dout by s (~1e-4) loses fp16 gradients to subnormals
        or zero; here dout is multiplied by s / c, formed in fp32 (at most 1: dout does not
        grow, and shrinks only by the row's ratio to the largest scale), and c, the largest
        scale, is the kernel's uniform per-channel scale (n,): the kernel's operands and its
        output stay in the range of the dequantize path's dout and W. The product is in
        dout's dtype, so the transient is one dout, as before."""
        # An all-zero row's scale is 1.0 (quantize_rows), far above c: its ratio, clamped at 1,
        # multiplies only zeros of q, where 1/c could overflow fp16 and make inf x 0 = NaN.
        scaled = dout * ops.cast(ops.minimum(scale / self.grad_scale, 1.0), dout.dtype)
        return ops.cast(scaled, self.dtype), q, ops.fill(self.dtype, (q.shape[1],), self.grad_scale)

    def construct(self, x, q, scale):
        if self.kernel == "wqbmm":
            return self.wqbmm(*self.forward_arguments(x, q, scale))
        rows = max(1, DEQUANT_BLOCK // q.shape[1])
        if rows >= q.shape[0]:
            return self.matmul(x, dequantized(ops.depend(q, x), scale, self.dtype))
        # A block of output channels at a time, each dequantized only after the previous
        # block's matmul (module docstring): at most one block of the layer's dequantized
        # weight exists. Its columns of x W^T are bit-identical to one matmul's on the CPU.
        pieces, previous = (), x
        for start in range(0, q.shape[0], rows):
            block = ops.depend(q, previous)[start:start + rows]
            previous = self.matmul(x, dequantized(block, scale[start:start + rows], self.dtype))
            pieces += (previous,)
        return ops.concat(pieces, 1)

    def bprop(self, x, q, scale, out, dout):
        if self.kernel == "wqbmm":
            dx = self.wqbmm_dx(*self.backward_arguments(dout, q, scale))
        else:
            dx = self.matmul_dx(dout, dequantized(ops.depend(q, dout), scale, self.dtype))
        return ops.cast(dx, x.dtype), ops.zeros_like(q), ops.zeros_like(scale)


class Int8Linear(nn.Cell):
    """In place of MindFormers' Linear (no bias, transpose_b, optional activation): the same
    reshape and casts (mindformers/modules/layers.py Linear.construct), an int8 weight."""

    def __init__(self, q, scale, compute_dtype, kernel: str = "dequant", activation=None):
        super().__init__()
        self.out_channels, self.in_channels = q.shape
        self.weight = ms.Parameter(ms.Tensor(q), name="weight", requires_grad=False)
        self.int8_scale = ms.Parameter(ms.Tensor(scale), name="int8_scale", requires_grad=False)
        self.int8_matmul = Int8MatMul(kernel, compute_dtype, gradient_scale(q, scale) if kernel == "wqbmm" else 1.0)
        self.dtype = compute_dtype
        self.activation = activation
        self.activation_flag = activation is not None

    def base(self, x):
        """x (N, in) in the compute dtype -> x W^T (N, out)."""
        return self.int8_matmul(x, self.weight, self.int8_scale)

    def construct(self, x, group_list=None):
        out_shape = x.shape[:-1] + (self.out_channels,)
        ori_dtype = x.dtype
        x = ops.cast(ops.reshape(x, (-1, self.in_channels)), self.dtype)
        x = self.base(x)
        if self.activation_flag:
            x = self.activation(x)
        return ops.cast(ops.reshape(x, out_shape), ori_dtype)


class Int8LoRALinear(Int8Linear):
    """mindpet's LoRADense (mindpet/delta/lora.py construct) over an int8 base: it adopts the
    adapters (Parameters, dropout, scaling) of the LoRADense it replaces, so their names,
    initial values and checkpoints are those of a LoRA run over a float base."""

    def __init__(self, q, scale, compute_dtype, kernel: str, lora_dense):
        super().__init__(q, scale, compute_dtype, kernel, lora_dense.activation)
        self.mindpet_delta_lora_a = lora_dense.mindpet_delta_lora_a
        self.mindpet_delta_lora_b = lora_dense.mindpet_delta_lora_b
        self.lora_dropout = lora_dense.lora_dropout
        self.scaling = lora_dense.scaling
        self.lora_a_matmul = ops.MatMul(transpose_b=True)
        self.lora_b_matmul = ops.MatMul(transpose_b=True)

    def base(self, x):
        dense = self.int8_matmul(x, self.weight, self.int8_scale)
        lora_a = ops.cast(self.mindpet_delta_lora_a, self.dtype)
        lora_b = ops.cast(self.mindpet_delta_lora_b, self.dtype)
        delta = self.lora_b_matmul(self.lora_a_matmul(self.lora_dropout(x), lora_a), lora_b)
        return dense + delta * ops.cast(self.scaling, self.dtype)
