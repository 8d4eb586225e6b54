"""selftest's check that a saturation in the forward pass alone is caught on the register path.

On a 910A an fp16 overflow saturates to 65504 instead of becoming inf, so only the
float-status registers see it, and only if they are not cleared between the forward and the
read. A layer that selective recompute does not recompute runs once, in the forward: the
value projection of the attention (selective recompute redoes the SwiGLU product and SiLU,
and without flash attention the scores and softmax: strategies/recompute.py). The step clears
the registers before the forward and reads them after the gradients (steps/graph_step.py
clear_registers_before); with the order of MindSpore 1.x (a clear after the forward) this
saturation would be lost and the step would update on it.

The check scales layer 0's value projection so that its fp16 output reaches 4 x 65504 on the
check's batch (its input is the embedding rows through the layer's RMSNorm, computed here in
numpy) and nothing else is changed; the loss scale is 1, so the backward has no scale to
overflow with. The step must flag the overflow and leave the weights bit-identical. Ascend
only (the register ops have no CPU kernel): not exercised by CI, which checks on the CPU that
the same setting in fp32 gives gradients far inside fp16's range while the projection's
output is beyond it (tests/test_selftest.py).
"""
from __future__ import annotations

import numpy as np

from .parts import MAX, Context, Spec, random_batch, weights
from .registers import step_on_registers

NAME = "overflow_forward_saturation"
FP16_MAX = 65504.0
OVERSHOOT = 4.0  # the projection's largest output, in units of FP16_MAX
VALUE = "model.layers.0.attention.wv.weight"
SETTING = ("strategies.precision.amp_level=O2", "strategies.precision.dtype=float16",
           "strategies.precision.loss_scale=static:1", "strategies.recompute.mode=selective")


def spec(ctx: Context) -> Spec:
    return Spec(NAME, "overflow", f"weights changed by a step (fp16, loss scale 1, selective recompute) whose only "
                                  f"saturation is layer 0's value projection, not recomputed, scaled to "
                                  f"{OVERSHOOT:g} x 65504 in the forward; the step must flag it and skip the update",
                0.0, MAX, recipes=(SETTING,),
                skip="no float-status register kernels on the CPU backend" if ctx.target == "cpu" else "")


def projection_peak(net, ids) -> float:
    """The largest |value projection| of layer 0 on `ids` (the model's input tokens), in fp32:
    the embedding rows through attention_norm (RMSNorm), times wv."""
    params = {p.name: p.asnumpy().astype(np.float64) for p in net.get_parameters()}
    x = params["model.tok_embeddings.embedding_weight"][ids[:, :-1]]
    eps = net.config.rms_norm_eps
    normed = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * params["model.layers.0.attention_norm.weight"]
    return float(np.abs(normed @ params[VALUE].T).max())


def saturate_value_projection(net, ids) -> float:
    """Scale layer 0's wv so that its output peaks at OVERSHOOT x 65504 on `ids`; the factor.
    The scaled weights themselves must stay well inside fp16 (their own cast must not
    saturate), or the check cannot be set up: an error, not a failure of the card."""
    import mindspore as ms  # imported here: MindSpore loads after run_selftest's quiet_frameworks

    (wv,) = [p for p in net.get_parameters() if p.name == VALUE]
    factor = OVERSHOOT * FP16_MAX / projection_peak(net, ids)
    largest = float(np.abs(wv.asnumpy()).max()) * factor
    if largest > FP16_MAX / 2:
        raise RuntimeError(f"{NAME}: the scaled value projection's largest weight, {largest:.4g}, would itself "
                           f"be near fp16's 65504")
    wv.set_data(ms.Tensor(wv.asnumpy() * factor, wv.dtype))
    return factor


def check_forward_saturation(ctx: Context, fault=None):
    """`fault`: the projection left as built, so nothing saturates and the weights move."""
    planned = spec(ctx)
    net, step, skipped = step_on_registers(ctx, planned)
    if skipped:
        return skipped
    batch = random_batch(2, 7)
    factor = 1.0 if fault else saturate_value_projection(net, batch[0])
    before = weights(net)
    result = step([batch], lr=1e-2)
    changed = sum(int(not np.array_equal(w, before[n])) for n, w in weights(net).items())
    return planned.result(result.overflow and changed == 0, float(changed),
                          f"overflow {result.overflow}, {changed} weights changed (wv x {factor:.3g}, "
                          f"loss {result.loss:.4g})")
