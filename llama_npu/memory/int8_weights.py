"""The planner's count of decoder linear weights held in int8 (weights/quantize.py's scheme:
per-output-channel symmetric int8 with one fp32 scale per output row), for `eval` /
`generate` of a quantized model and for LoRA over an int8 frozen base.

Each linear layer dequantizes its own weight right before its matmul, in the forward and
again in the backward, and never keeps it across the step (model/int8_linear.py): the
forward does it DEQUANT_BLOCK weights at a time, each block after the previous block's
matmul, the backward whole, after dout. No chain is shared between two forwards (DPO's
adapters-off reference and the policy) or a forward and a backward, so nothing dequantized
stays alive between them. What nothing orders: layers reading one input (wq, wk, wv; w1, w3)
may dequantize their first blocks at once, and their bprops, whose douts arrive together,
their whole weights at once. The transient is the worst such group."""
from __future__ import annotations

from ..model.architecture import LlamaShape
from ..model.dequant_block import DEQUANT_BLOCK
from ..strategies.lora import SHAPES

SCALE_BYTES = 4  # weights/quantize.py stores the scales as float32, one per output channel


def linear_shapes(shape: LlamaShape) -> dict:
    """(in, out) of each of a decoder layer's seven linear weights."""
    dims = {"h": shape.hidden_size, "f": shape.intermediate_size, "kv": shape.num_kv_heads * shape.head_dim}
    return {name: (dims[i], dims[o]) for name, (i, o) in SHAPES.items()}


def int8_layer_bytes(shape: LlamaShape) -> int:
    """One decoder layer's linear weights: 1 byte a weight plus its output channels' scales."""
    return sum(i * o + o * SCALE_BYTES for i, o in linear_shapes(shape).values())


# Linear layers of a decoder layer that read one input in the forward and get their douts
# together in the backward (MindFormers' llama_transformer.py: wq, wk, wv of the attention's
# input; w1, w3 of the MLP's): a scheduler may dequantize a group's weights at once.
TOGETHER = (("wq", "wk", "wv"), ("wo",), ("w1", "w3"), ("w2",))


def dequantized_weight_bytes(shape: LlamaShape, compute_bytes: int, fused_kernel: bool,
                             forward_only: bool = False) -> int:
    """The dequantized weights alive at once, the worst group of TOGETHER: each member's
    whole weight (the bprops), or its first block when only the forward runs, in the compute
    dtype, and one of them still being formed: q cast to fp32 and multiplied by the scales
    in fp32, 4 + 4 bytes a weight more. On Atlas A2/A3 (the 910B) in half precision,
    WeightQuantBatchMatmul dequantizes inside the kernel and forms none."""
    if fused_kernel and compute_bytes == 2:
        return 0
    dims = linear_shapes(shape)

    def weights(name: str) -> int:
        i, o = dims[name]
        return min(o, max(1, DEQUANT_BLOCK // i)) * i if forward_only else i * o

    return max(compute_bytes * sum(map(weights, group)) + 8 * max(map(weights, group)) for group in TOGETHER)
