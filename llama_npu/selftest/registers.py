"""selftest's probe of the float-status registers: on every device and mode where the train
step's overflow check picks them (steps/graph_step.py overflow_check: the 910A, and a 910B with
MS_ASCEND_CHECK_OVERFLOW_MODE=SATURATION_MODE), a computation that saturates without
becoming inf must raise the flag, read through the step cell's own get_overflow_status.

The computation is MindSpore's own example for the register ops
(mindspore/ops/operations/math_ops.py, NPUGetFloatStatusV2): clear, then x - (-x) on fp16
65504, which saturates to 65504 in saturation mode and sets the register; with x = 10 the
flag stays clear. The register ops have no CPU kernel, so this runs on a card only
(not exercised by CI); the CPU reports a skip with the reason.
"""
from __future__ import annotations

import numpy as np

from .parts import MAX, Context, Spec, build, train_step

NAME = "overflow_saturation_registers"
SATURATING, CONTROL = 65504.0, 10.0  # the largest finite fp16, and a value far from it
FP16_DYNAMIC = ("strategies.precision.amp_level=O2", "strategies.precision.dtype=float16",
                "strategies.precision.loss_scale=dynamic")


def spec(ctx: Context) -> Spec:
    return Spec(NAME, "overflow", "fp16 x - (-x) at x = 65504 between a register clear and the step's own read: "
                                  "problems among [flag raised, result finite (saturated, not inf), control x = 10 "
                                  "leaves the flag clear]; runs where the step's overflow check is the registers "
                                  "(910A; 910B with MS_ASCEND_CHECK_OVERFLOW_MODE=SATURATION_MODE)",
                0.0, MAX, recipes=(FP16_DYNAMIC,),
                skip="no float-status register kernels on the CPU backend (the step checks gradients with an "
                     "is-finite reduction there)" if ctx.target == "cpu" else "")


def probe_cell(step_cell):
    """(overflow flag, result finite) of x - (-x) between a clear and `step_cell`'s read."""
    # imported here: MindSpore loads after run_selftest's quiet_frameworks
    import mindspore as ms
    from mindspore import Tensor, nn, ops
    from mindspore.ops.operations.math_ops import NPUClearFloatStatusV2

    class SaturationProbe(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.step_cell = step_cell
            self.clear_status = NPUClearFloatStatusV2()

        def construct(self, x):
            status = Tensor([0] * 8, dtype=ms.int32)
            x = ops.depend(x, self.clear_status(status))
            out = x - (-x)
            return self.step_cell.get_overflow_status(status, out), ops.isfinite(out).all()

    return SaturationProbe()


def step_on_registers(ctx: Context, planned: Spec) -> tuple:
    """(net, its train step, None) built from the Spec's first recipe, or (None, None, a skip)
    where the Spec skips or the step's overflow check on this device is not the registers."""
    from ..steps.graph_step import REGISTERS, overflow_check  # imported here: it loads MindSpore

    if planned.skip:
        return None, None, planned.skipped()
    recipe, net, cell = build(ctx, *planned.recipes[0])
    step = train_step(recipe, net, cell)
    mode = overflow_check(step.final)
    if mode != REGISTERS:
        return None, None, planned.skipped(f"the step's overflow check on this {ctx.soc} is {mode}, not the "
                                           f"registers (MS_ASCEND_CHECK_OVERFLOW_MODE="
                                           f"{step.final._ascend_check_overflow_mode})")
    return net, step, None


def check_saturation_registers(ctx: Context, fault=None):
    """The probe at 65504 and at 10 (`fault`: 10 both times, so nothing saturates)."""
    from mindspore import Tensor  # imported here: MindSpore loads after run_selftest's quiet_frameworks

    planned = spec(ctx)
    _, step, skipped = step_on_registers(ctx, planned)
    if skipped:
        return skipped
    probe = probe_cell(step.final)
    flagged, finite = (bool(v.asnumpy()) for v in probe(Tensor(np.full((2, 3), CONTROL if fault else SATURATING,
                                                                       np.float16))))
    control, _ = (bool(v.asnumpy()) for v in probe(Tensor(np.full((2, 3), CONTROL, np.float16))))
    problems = [what for what, bad in (("the registers did not flag a saturated fp16 result", not flagged),
                                       ("the result was not finite: this device is not in saturation mode", not finite),
                                       ("the registers flagged the control run (x = 10)", control)) if bad]
    return planned.result(not problems, float(len(problems)), "; ".join(problems))
