"""The arguments model/int8_linear.py passes MindSpore's WeightQuantBatchMatmul on Atlas A2/A3
(the 910B), as shapes, and the rule CANN checks them by. A leaf without MindSpore:
`selftest --dry-run` lists them, and tests/test_int8.py checks the cell's own arguments
(Int8MatMul.forward_arguments / backward_arguments) against both.

CANN's rule for a per-channel antiquant_scale on A2/A3: (n,) or (1, n), n the output's
columns; (n, 1) only on the 310P with an NZ-format weight (aclnn_weight_quant_batch_matmul_v2.cpp
CheckAntiquantParamShape, FACTS.md). MindSpore hands the scale over as it is and transposes
only the weight's view (transpose_weight; mindspore/ops/auto_generate/gen_ops_prim.py
WeightQuantBatchMatmul, pyboost_impl/customize/weight_quant_batch_matmul.h).
"""
from __future__ import annotations


def per_channel_scale_ok(weight: tuple, scale: tuple, transpose_weight: bool) -> bool:
    """CheckAntiquantParamShape's per-channel case on A2/A3: the weight is (k, n), or (n, k)
    with transpose_weight; the scale is (n,) or (1, n)."""
    n = weight[0] if transpose_weight else weight[1]
    return tuple(scale) in ((n,), (1, n))


def wqbmm_argument_shapes(rows: int, in_channels: int, out_channels: int) -> dict:
    """call -> {argument: shape, transpose_weight}: the forward's x W^T and the bprop's dx = dout W."""
    return {"forward": {"x": (rows, in_channels), "weight": (out_channels, in_channels),
                        "antiquant_scale": (out_channels,), "transpose_weight": True},
            "backward": {"x": (rows, out_channels), "weight": (out_channels, in_channels),
                         "antiquant_scale": (in_channels,), "transpose_weight": False}}


def describe(shapes: dict) -> str:
    """'forward x (32, 96), weight (64, 96), antiquant_scale (64,), transpose_weight True; backward ...'"""
    return "; ".join(f"{call} " + ", ".join(f"{k} {v}" for k, v in args.items()) for call, args in shapes.items())
