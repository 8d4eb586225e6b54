"""Mixed precision and loss scaling.

amp_level maps onto MindFormers' dtype switches: O0 keeps everything fp32; O1 and O2 run
the matmuls in `dtype` on fp32 parameters (fp32 master weights and optimizer states); O3
stores the parameters in `dtype` as well. Norms, softmax and rotary stay fp32 at every
level, as MindFormers recommends (see model.llama_config).
"""
from __future__ import annotations

from ..recipe import PrecisionSection, parse_loss_scale


def model_dtypes(section: PrecisionSection) -> dict:
    """compute_dtype and param_dtype for model.llama_config."""
    if section.amp_level == "O0":
        return {"compute_dtype": "float32", "param_dtype": "float32"}
    if section.amp_level == "O3":
        return {"compute_dtype": section.dtype, "param_dtype": section.dtype}
    return {"compute_dtype": section.dtype, "param_dtype": "float32"}


class LossScaler:
    """The loss is multiplied by `scale` before backward and gradients divided after.

    dynamic: on overflow the step is skipped and the scale divided by `factor`; after
    `window` clean steps in a row it is multiplied by `factor`. static: the scale never
    changes, overflowed steps are still skipped. none: scale 1.
    """

    MIN_SCALE = 1.0

    def __init__(self, section: PrecisionSection):
        self.kind, static_value = parse_loss_scale(section.loss_scale)
        self.scale = {"none": 1.0, "static": static_value, "dynamic": section.loss_scale_init}[self.kind]
        self.factor = section.loss_scale_factor
        self.window = section.loss_scale_window
        self.clean_steps = 0

    def update(self, overflow: bool) -> None:
        if self.kind != "dynamic":
            return
        if overflow:
            self.scale = max(self.scale / self.factor, self.MIN_SCALE)
            self.clean_steps = 0
            return
        self.clean_steps += 1
        if self.clean_steps >= self.window:
            self.scale *= self.factor
            self.clean_steps = 0

    def state(self) -> dict:
        return {"scale": self.scale, "clean_steps": self.clean_steps}

    def load_state(self, state: dict) -> None:
        self.scale = float(state["scale"])
        self.clean_steps = int(state["clean_steps"])
