"""The planner's count of decoder linear weights held in int8 (weights/quantize.py's scheme:
per-output-channel symmetric int8 with one fp32 scale per output row), for `eval` /
`generate` of a quantized model and for LoRA over an int8 frozen base.

Each linear layer dequantizes its own weight right before its matmul, in the forward and
again in the backward, and never keeps it across the step (model/int8_linear.py): the
forward does it DEQUANT_BLOCK weights at a time, the backward whole, so the transient is one
block in inference and the largest linear weight of a layer in training."""
from __future__ import annotations

from ..model.architecture import LlamaShape
from ..strategies.lora import SHAPES

SCALE_BYTES = 4  # weights/quantize.py stores the scales as float32, one per output channel
# Weights the forward dequantizes at a time, whole output channels (model/int8_linear.py):
# 8 MB in fp32, where the 1B's MLP weight is 67 MB.
DEQUANT_BLOCK = 1 << 21


def linear_shapes(shape: LlamaShape) -> dict:
    """(in, out) of each of a decoder layer's seven linear weights."""
    dims = {"h": shape.hidden_size, "f": shape.intermediate_size, "kv": shape.num_kv_heads * shape.head_dim}
    return {name: (dims[i], dims[o]) for name, (i, o) in SHAPES.items()}


def int8_layer_bytes(shape: LlamaShape) -> int:
    """One decoder layer's linear weights: 1 byte a weight plus its output channels' scales."""
    return sum(i * o + o * SCALE_BYTES for i, o in linear_shapes(shape).values())


def dequantized_weight_bytes(shape: LlamaShape, compute_bytes: int, fused_kernel: bool,
                             forward_only: bool = False) -> int:
    """The transient of dequantizing one weight (the largest; one block of it when only the
    forward runs). On Atlas A2/A3 (the 910B) in half precision, WeightQuantBatchMatmul
    dequantizes inside the kernel and forms none. Elsewhere (the 910A, the CPU, fp32 compute)
    q is cast to fp32, multiplied by the scales in fp32 and the product cast to the compute
    dtype: 4 + 4 + compute bytes a weight at worst."""
    if fused_kernel and compute_bytes == 2:
        return 0
    if forward_only:
        weights = max(min(o, max(1, DEQUANT_BLOCK // i)) * i for i, o in linear_shapes(shape).values())
    else:
        weights = max(i * o for i, o in linear_shapes(shape).values())
    return (4 + 4 + compute_bytes) * weights
