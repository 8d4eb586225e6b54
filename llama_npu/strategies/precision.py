"""Mixed precision and loss scaling.

amp_level maps onto MindFormers' dtype switches: O0 keeps everything fp32; O1 and O2 run
the matmuls in `dtype` on fp32 parameters (fp32 master weights and optimizer states); O3
stores the parameters in `dtype` as well. Norms, softmax and rotary stay fp32 at every
level, as MindFormers recommends (see model.llama_config).
"""
from __future__ import annotations

from ..recipe.schema import PrecisionSection, parse_loss_scale


def model_dtypes(section: PrecisionSection) -> dict:
    """compute_dtype and param_dtype for model.llama_config."""
    if section.amp_level == "O0":
        return {"compute_dtype": "float32", "param_dtype": "float32"}
    if section.amp_level == "O3":
        return {"compute_dtype": section.dtype, "param_dtype": section.dtype}
    return {"compute_dtype": section.dtype, "param_dtype": "float32"}


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
        import mindspore as ms
        from mindspore import Tensor

        update = cell.loss_scaling_manager
        if update is None:  # a fixed scale is the recipe's, not the checkpoint's
            return
        cell.scale_sense.set_data(Tensor(float(state["scale"]), ms.float32))
        update.cur_iter.set_data(Tensor(int(state["clean_steps"]) + 1, ms.int32))
        update.last_overflow_iter.set_data(Tensor(0, ms.int32))
