"""selftest's int8_matmul: the int8 linear cell eval, generate and LoRA's int8 base run on this
device (model/int8_linear.py: WeightQuantBatchMatmul with its own bprop on Atlas A2/A3, cast
and scale on the 910A and the CPU), forward and input gradient, against the fp16 reference
over the dequantized weight q x s computed in numpy."""
from __future__ import annotations

import numpy as np

from ..weights.tensor_files import dequantize_rows, quantize_rows
from .parts import MAX, Check, Context, Spec

TOLERANCE = 1e-2  # fp16 rounding of a 96-term sum, relative to the output's largest value
ROWS, IN, OUT = 32, 96, 64  # the layer checked: x (ROWS, IN) -> (ROWS, OUT)


def int8_spec(ctx: Context) -> Spec:
    from ..model.llama import fused_kernels
    from ..model.wqbmm_arguments import describe, wqbmm_argument_shapes

    # On Atlas A2/A3 the kernel's arguments are named: CANN refuses a scale in another layout.
    kernel = (f"WeightQuantBatchMatmul: {describe(wqbmm_argument_shapes(ROWS, IN, OUT))}"
              if fused_kernels(ctx.target == "ascend", ctx.soc) else "cast and scale")
    return Spec("int8_matmul", "int8", f"the int8 linear ({kernel}, fp16) forward and input gradient against the "
                                       f"fp16 reference over q x s, largest relative difference", TOLERANCE, MAX)


def check_int8_matmul(ctx: Context, fault=None) -> Check:
    """A ROWS x IN -> OUT int8 linear layer: y = x W^T and dx = g W with W = q x s. `fault`: the
    cell's scales broken (each row's scale doubled), the reference keeping the true ones."""
    import mindspore as ms  # imported here: MindSpore loads after run_selftest's quiet_frameworks

    from ..model.int8_linear import Int8Linear, int8_kernel

    rng = np.random.default_rng(0)
    q, scale = quantize_rows(rng.standard_normal((OUT, IN)).astype(np.float32))
    x = rng.standard_normal((ROWS, IN)).astype(np.float16)
    g = rng.standard_normal((ROWS, OUT)).astype(np.float16)
    kernel = int8_kernel(ctx.target == "ascend", ctx.soc, "float16")
    cell = Int8Linear(q, scale * 2 if fault else scale, ms.float16, kernel)

    def weighted(inputs):
        return (cell(inputs) * ms.Tensor(g)).sum()

    y = cell(ms.Tensor(x)).asnumpy().astype(np.float32)
    dx = ms.grad(weighted)(ms.Tensor(x)).asnumpy().astype(np.float32)
    w = dequantize_rows(q, scale).astype(np.float16).astype(np.float32)
    y_ref, dx_ref = x.astype(np.float32) @ w.T, g.astype(np.float32) @ w
    figure = max(float(np.abs(y - y_ref).max() / np.abs(y_ref).max()),
                 float(np.abs(dx - dx_ref).max() / np.abs(dx_ref).max()))
    return int8_spec(ctx).judged(figure, f"int8 linear ({kernel}) differs from the fp16 q x s reference by "
                                         f"{figure:.3g} relative")
