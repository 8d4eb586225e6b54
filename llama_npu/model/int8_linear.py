"""The decoder's linear layers with their weight held as int8 + per-output-channel fp32 scales
(weights/quantize.py's scheme: W ~ q x s[:, None]), dequantized one layer at a time inside the
forward, and again inside the backward: the dequantized weight never outlives its matmul.

Two kernels do the same math:
- "dequant" (the CPU, the 910A, and any fp32 compute): cast q to fp32, multiply by s, cast to
  the compute dtype, MatMul(transpose_b=True), as MindFormers' Linear does with its float
  weight (mindformers/modules/layers.py Linear.construct). The fp32 product then the cast
  is what dequantize-at-load followed by Linear's cast computes, so the result is bit-exact.
- "wqbmm" (Atlas A2/A3, the 910B, fp16/bf16 compute): MindSpore's WeightQuantBatchMatmul
  (mindspore/ops/auto_generate/gen_ops_prim.py; CANN's aclnnWeightQuantBatchMatmulV2, which
  lists no 910A support) with transpose_weight=True and the scales as (out, 1).
WeightQuantBatchMatmul has no bprop (FACTS.md), so Int8MatMul carries its own: the input
gradient dx = dout W = (dout x s) q is the same op over the untransposed q with unit scales
on the 910B, the recomputed dequantized weight elsewhere. q and s are frozen (zero grads).

Ascend kernels here are not exercised by CI (no NPU); the CPU runs the dequant kernel.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops
from mindspore.ops.auto_generate import WeightQuantBatchMatmul

from ..memory.int8_weights import DEQUANT_BLOCK
from .llama import fused_kernels


def int8_kernel(on_ascend: bool, device_name: str, compute_dtype: str) -> str:
    """WeightQuantBatchMatmul where CANN has it and the activations are half precision (it
    takes no fp32 x): Atlas A2/A3, the same cards as FlashAttentionScore (llama.fused_kernels)."""
    half = compute_dtype in ("float16", "bfloat16")
    return "wqbmm" if half and fused_kernels(on_ascend, device_name) else "dequant"



def dequantized(q, scale, dtype):
    """q x s in fp32 (exactly tensor_files.dequantize_rows), then cast to `dtype`."""
    return ops.cast(ops.cast(q, ms.float32) * ops.expand_dims(scale, 1), dtype)


class Int8MatMul(nn.Cell):
    """x (N, in) -> x W^T with W = q x s (out, in) formed inside the forward and the backward."""

    def __init__(self, kernel: str, compute_dtype):
        super().__init__()
        self.kernel, self.dtype = kernel, compute_dtype
        self.matmul = ops.MatMul(transpose_b=True)
        self.matmul_dx = ops.MatMul()
        if kernel == "wqbmm":
            self.wqbmm = WeightQuantBatchMatmul(transpose_weight=True)
            self.wqbmm_dx = WeightQuantBatchMatmul()

    def construct(self, x, q, scale):
        if self.kernel == "wqbmm":
            return self.wqbmm(x, q, ops.expand_dims(ops.cast(scale, self.dtype), 1))
        rows = max(1, DEQUANT_BLOCK // q.shape[1])
        if rows >= q.shape[0]:
            return self.matmul(x, dequantized(q, scale, self.dtype))
        # A block of output channels at a time, so that where the backend frees a kernel's
        # buffers (PyNative) at most one block of the layer's dequantized weight exists: its
        # columns of x W^T are bit-identical to one matmul's on the CPU backend (checked).
        pieces = ()
        for start in range(0, q.shape[0], rows):
            pieces += (self.matmul(x, dequantized(q[start:start + rows], scale[start:start + rows], self.dtype)),)
        return ops.concat(pieces, 1)

    def bprop(self, x, q, scale, out, dout):
        if self.kernel == "wqbmm":  # (dout x s) q: per-output-channel scales move onto dout
            scaled = ops.cast(dout * ops.cast(scale, dout.dtype), self.dtype)
            dx = self.wqbmm_dx(scaled, q, ops.ones((q.shape[1],), self.dtype))
        else:
            dx = self.matmul_dx(dout, dequantized(q, scale, self.dtype))
        return ops.cast(dx, x.dtype), ops.zeros_like(q), ops.zeros_like(scale)


class Int8Linear(nn.Cell):
    """In place of MindFormers' Linear (no bias, transpose_b, optional activation): the same
    reshape and casts (mindformers/modules/layers.py Linear.construct), an int8 weight."""

    def __init__(self, q, scale, compute_dtype, kernel: str = "dequant", activation=None):
        super().__init__()
        self.out_channels, self.in_channels = q.shape
        self.weight = ms.Parameter(ms.Tensor(q), name="weight", requires_grad=False)
        self.int8_scale = ms.Parameter(ms.Tensor(scale), name="int8_scale", requires_grad=False)
        self.int8_matmul = Int8MatMul(kernel, compute_dtype)
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
