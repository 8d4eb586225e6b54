"""Mixed precision and loss scaling.

amp_level maps onto MindFormers' dtype switches: O0 keeps everything fp32; O1 and O2 run
the matmuls in `dtype` on fp32 parameters (fp32 master weights and optimizer states); O3
stores the parameters in `dtype` as well. Norms, softmax and rotary stay fp32 at every
level, as MindFormers recommends (see model.llama_config).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List

# The section's dtypes, defined in model/ so that weights/ reads them too; the network and the
# session take them from here, with the section.
from ..model.precision_dtypes import model_dtypes  # noqa: F401
from ..recipe.problems import Problems, RecipeError, choice, positive

KEY = "precision"
CHECKED_AFTER = ()
PROFILE_VALUE = re.compile(r"O[0-3](:(float16|bfloat16))?$")
PROFILE_EXPECTED = "O0, O1, O2 or O3, optionally :float16 or :bfloat16"


@dataclass
class PrecisionSection:
    amp_level: str = "O0"  # O0 | O1 | O2 | O3
    dtype: str = "float16"  # compute dtype when amp_level != O0: float16 | bfloat16
    loss_scale: str = "none"  # none | dynamic | static:VALUE
    loss_scale_init: float = 65536.0
    loss_scale_factor: float = 2.0
    loss_scale_window: int = 1000


SECTION = PrecisionSection


def parse_loss_scale(text: str) -> tuple[str, float]:
    """'none' | 'dynamic' | 'static:VALUE' -> (kind, static value or 0)."""
    if text in ("none", "dynamic"):
        return text, 0.0
    if text.startswith("static:"):
        try:
            value = float(text.split(":", 1)[1])
        except ValueError:
            value = -1.0
        if value > 0:
            return "static", value
    raise RecipeError(f"strategies.precision.loss_scale: expected none, dynamic or static:VALUE "
                      f"(VALUE > 0), got {text!r}")


def check(recipe) -> None:
    """Every problem of the precision section, with the device and optimizer it runs with."""
    p, dev, problems = recipe.strategies.precision, recipe.device, Problems()
    problems.check(choice, "strategies.precision.amp_level", p.amp_level, ("O0", "O1", "O2", "O3"))
    problems.check(choice, "strategies.precision.dtype", p.dtype, ("float16", "bfloat16"))
    if p.amp_level != "O0" and p.dtype == "bfloat16" and dev.name == "910a":
        problems.append("strategies.precision.dtype=bfloat16 with device.name=910a: the Ascend 910A "
                        "has no BF16 kernels; use dtype float16 with loss_scale dynamic")
    if p.amp_level != "O0" and p.dtype == "bfloat16" and dev.target == "cpu":
        problems.append("strategies.precision.dtype=bfloat16 with device.target=cpu: MindSpore's CPU "
                        "backend has no BF16 kernels (Reshape fails); use float16 or amp_level O0 on CPU")
    if p.amp_level == "O3" and recipe.train.optimizer.name == "adamw" and not recipe.strategies.lora.enabled:
        problems.append("strategies.precision.amp_level=O3 with train.optimizer.name=adamw: O3 stores the "
                        "weights and AdamW's moments in half precision, where the update diverges (eps "
                        "underflows); use O2 (fp32 master weights), LoRA (fp32 adapters) or sgd")
    problems.check(_check_loss_scale, p)
    problems.raise_any()


def _check_loss_scale(p: PrecisionSection) -> None:
    problems = Problems()
    scale = problems.check(parse_loss_scale, p.loss_scale)
    if scale is not None and scale[0] != "none" and (p.amp_level == "O0" or p.dtype == "bfloat16"):
        why = ("amp_level O0 computes in fp32: nothing is in fp16 to scale" if p.amp_level == "O0" else
               "bfloat16 has fp32's exponent range and needs no scaling")
        problems.append(f"strategies.precision.loss_scale={p.loss_scale} with amp_level {p.amp_level} and dtype "
                        f"{p.dtype}: {why}; set loss_scale none")
    problems.check(positive, "strategies.precision.loss_scale_init", p.loss_scale_init)
    if p.loss_scale_factor <= 1.0:
        problems.append(f"strategies.precision.loss_scale_factor: expected a value > 1, "
                        f"got {p.loss_scale_factor}")
    problems.check(positive, "strategies.precision.loss_scale_window", p.loss_scale_window)
    problems.raise_any()


def rehearse(r) -> None:
    """Precision and loss scaling rehearse as set, in float16 where the recipe asks bfloat16."""
    p = r.recipe.strategies.precision
    if r.recipe.device.name == "910a" and p.loss_scale != "none":
        r.not_rehearsed.append("the 910A's overflow registers: on the CPU loss scaling checks gradients "
                               "with is-finite")
    if p.amp_level != "O0" and p.dtype == "bfloat16":
        r.change("strategies.precision.dtype", "float16", "the CPU has no BF16 kernels")


def profile_value_ok(value: str) -> bool:
    return bool(PROFILE_VALUE.match(value))


def profile_overrides(value: str, base) -> List[str]:
    """LEVEL[:DTYPE]; without DTYPE the recipe's. Half precision with float16 gets a dynamic
    loss scale, as `plan --write-recipe` writes it; O0 needs none."""
    level, _, dtype = value.partition(":")
    dtype = dtype or base.strategies.precision.dtype
    loss_scale = "dynamic" if level != "O0" and dtype == "float16" else "none"
    return [f"strategies.precision.amp_level={level}", f"strategies.precision.dtype={dtype}",
            f"strategies.precision.loss_scale={loss_scale}"]


# ---------------------------------------------------------------- planner term

def plan_settings(recipe) -> dict:
    p = recipe.strategies.precision
    return {"amp_level": p.amp_level, "dtype": p.dtype}


def activation_bytes(s) -> int:
    """Bytes of an activation (and of a weight's half copy): the compute dtype's."""
    return 2 if s.amp_level != "O0" else 4


def weight_bytes(s, on_device: int, trainable: int, frozen: bool) -> tuple[int, int]:
    """(weights, their compute copies) in bytes. A frozen base (LoRA) is stored in the compute
    dtype beside fp32 trainable adapters; else the parameters are fp32 (the half dtype under
    O3), with half copies for the matmuls under O1/O2, kept by autodiff for the backward."""
    if frozen:
        return on_device * activation_bytes(s) + trainable * 4, 0
    weights = on_device * (2 if s.amp_level == "O3" else 4)
    return weights, on_device * 2 if s.amp_level in ("O1", "O2") else 0


def gradient_bytes(s, frozen: bool, accumulates: bool) -> int:
    """O3 keeps one micro-batch's gradients in the half weights' dtype; fp32 otherwise."""
    return 2 if s.amp_level == "O3" and not frozen and not accumulates else 4


def half_update_copy(s, frozen: bool, accumulates: bool, gradients: int) -> int:
    """O3 accumulating: the fp32 accumulators cast to the half weights for the update."""
    return gradients // 2 if s.amp_level == "O3" and accumulates and not frozen else 0


def scaling_copies(s, frozen: bool, accumulates: bool, gradients: int, largest: int, out_of_place: bool) -> int:
    """What the train step's unscale and clip (steps/graph_step.py) make beside `gradients` bytes
    of gradients whose largest tensor has `largest` elements: nothing where fp32 gradients are
    multiplied in place. A whole new set where the products are new tensors -- on GE, which has
    no InplaceMul (`out_of_place`: the 910A's default jit level O2, common/jit_level.py), and
    for O3's half gradients -- counted at the worst case, since the graph's execution order
    need not consume each product before making the next. O3's half gradients are multiplied
    in fp32 and cast back one at a time: the largest one's fp32 cast and product in flight."""
    half = gradient_bytes(s, frozen, accumulates) == 2
    return (gradients if half or out_of_place else 0) + (8 * largest if half else 0)


class LossScaler:
    """The loss is multiplied by the scale before backward and the gradients divided after;
    the train step keeps the scale on the device (its `scale_sense` Parameter).

    dynamic: MindSpore's DynamicLossScaleUpdateCell -- on overflow the step is skipped and the
    scale divided by `factor` (not below 1); after `window` clean steps in a row it is
    multiplied by `factor`. static: the scale never changes, overflowed steps are still
    skipped. none: scale 1.
    """

    MIN_SCALE = 1.0  # DynamicLossScaleUpdateCell's minimum_loss_scale

    def __init__(self, section: PrecisionSection):
        self.kind, static_value = parse_loss_scale(section.loss_scale)
        self.initial = {"none": 1.0, "static": static_value, "dynamic": section.loss_scale_init}[self.kind]
        self.factor = section.loss_scale_factor
        self.window = section.loss_scale_window

    def sense(self):
        """`scale_sense` for nn.TrainOneStepWithLossScaleCell: an update cell or a fixed value."""
        # imported here: recipe validation imports this module, and it needs no MindSpore
        import mindspore as ms
        from mindspore import Tensor, nn

        if self.kind == "dynamic":
            return nn.DynamicLossScaleUpdateCell(self.initial, self.factor, self.window)
        return Tensor(self.initial, ms.float32)

    def state(self, cell) -> dict:
        """The checkpoint sidecar's {scale, clean_steps}, read from the device. The update
        cell counts iterations: the clean steps since the last overflow or increase are
        cur_iter - 1 - last_overflow_iter."""
        update = cell.loss_scaling_manager
        clean = 0 if update is None else int(update.cur_iter.asnumpy()) - 1 - int(update.last_overflow_iter.asnumpy())
        return {"scale": float(cell.scale_sense.asnumpy()), "clean_steps": clean}

    def load_state(self, cell, state: dict) -> None:
        # imported here: as in sense()
        import mindspore as ms
        from mindspore import Tensor

        update = cell.loss_scaling_manager
        if update is None:  # a fixed scale is the recipe's, not the checkpoint's
            return
        cell.scale_sense.set_data(Tensor(float(state["scale"]), ms.float32))
        update.cur_iter.set_data(Tensor(int(state["clean_steps"]) + 1, ms.int32))
        update.last_overflow_iter.set_data(Tensor(0, ms.int32))
