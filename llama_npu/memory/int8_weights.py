"""The planner's count of decoder linear weights held in int8 (weights/quantize.py's scheme:
per-output-channel symmetric int8 with one fp32 scale per output row), for `eval` /
`generate` of a quantized model and for LoRA over an int8 frozen base.

Each linear layer dequantizes its own weight right before its matmul, in the forward and
again in the backward, and never keeps it across the step (model/int8_linear.py): the
transient is one weight's, counted for the largest linear weight of a layer."""
from __future__ import annotations

from ..model.architecture import LlamaShape
from ..strategies.lora import SHAPES

SCALE_BYTES = 4  # weights/quantize.py stores the scales as float32, one per output channel


def linear_shapes(shape: LlamaShape) -> dict:
    """(in, out) of each of a decoder layer's seven linear weights."""
    dims = {"h": shape.hidden_size, "f": shape.intermediate_size, "kv": shape.num_kv_heads * shape.head_dim}
    return {name: (dims[i], dims[o]) for name, (i, o) in SHAPES.items()}


def int8_layer_bytes(shape: LlamaShape) -> int:
    """One decoder layer's linear weights: 1 byte a weight plus its output channels' scales."""
    return sum(i * o + o * SCALE_BYTES for i, o in linear_shapes(shape).values())


def dequantized_weight_bytes(shape: LlamaShape, compute_bytes: int, fused_kernel: bool) -> int:
    """The transient of dequantizing one weight (the largest). On Atlas A2/A3 (the 910B) in half
    precision, WeightQuantBatchMatmul dequantizes inside the kernel and forms none. Elsewhere
    (the 910A, the CPU, fp32 compute) q is cast to fp32, multiplied by the scales in fp32 and
    the product cast to the compute dtype: 4 + 4 + compute bytes a weight at worst."""
    if fused_kernel and compute_bytes == 2:
        return 0
    return (4 + 4 + compute_bytes) * max(i * o for i, o in linear_shapes(shape).values())
