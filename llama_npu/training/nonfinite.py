"""Non-finite steps: a step whose loss or gradients are not finite is skipped by TrainStep;
`NonFiniteStreak` stops the run after a streak of them that loss scaling cannot explain (no
dynamic scaling, or the scale at its floor), and `all_finite` keeps such weights out of a
checkpoint."""
from __future__ import annotations

from typing import Optional

from mindspore import ops


class NonFiniteStreak:
    """Counts skipped non-finite steps in a row that loss scaling does not account for."""

    def __init__(self, limit: int, scaler):
        self.limit = limit  # 0: never stop
        self.scaler = scaler
        self.count = 0
        self.first_step: Optional[int] = None

    def update(self, step: int, overflow: bool, scale_used: float) -> None:
        # A dynamic scaler above its floor overflows on purpose: it is finding its scale.
        searching = self.scaler.kind == "dynamic" and scale_used > self.scaler.MIN_SCALE
        if not overflow or searching:
            self.count, self.first_step = 0, None
            return
        self.count += 1
        self.first_step = step if self.first_step is None else self.first_step

    @property
    def exhausted(self) -> bool:
        return self.limit > 0 and self.count >= self.limit

    def message(self, step: int, last_checkpoint: Optional[str]) -> str:
        kept = (f"the last checkpoint, {last_checkpoint}, was written after a finite step"
                if last_checkpoint else "no checkpoint was written")
        return (f"steps {self.first_step}-{step}: loss or gradients were not finite {self.count} times in a "
                f"row (train.max_nonfinite_steps={self.limit}); every one was skipped and the run stopped; "
                f"{kept}. Lower train.optimizer.lr, enable loss scaling or use amp_level O0/bfloat16, "
                f"then resume")


def all_finite(params) -> bool:
    """Whether every weight is finite, checked where the weights live (device or host)."""
    return all(bool(ops.isfinite(p).all()) for p in params)
