"""Ending a run without losing work: on a signal, after a streak of non-finite steps, or
when a checkpoint cannot be written.

- `StopSignals`: the first SIGTERM/SIGINT only sets a flag; the loop finishes the current
  optimizer step, writes a checkpoint and exits with PREEMPTED. The handlers are then reset
  to the defaults, so a second signal ends the process at once. Checkpoints are written
  under a temporary name and renamed (atomic.py), so dying mid-save leaves the previous
  complete checkpoint as it was.
- `NonFiniteStreak`: a step whose loss or gradients are not finite is skipped by TrainStep;
  a streak of them that loss scaling cannot explain (no dynamic scaling, or the scale at its
  floor) stops the run.
"""
from __future__ import annotations

import signal
from typing import Optional

# sysexits.h EX_TEMPFAIL: "temporary failure, the user is invited to retry" -- here, to rerun
# with --resume auto. Distinct from 1 (failure) and from 128+N (killed by signal N).
PREEMPTED = 75


class RunFailure(RuntimeError):
    """The run cannot go on; the message says why and what the last good checkpoint is."""


class StopSignals:
    """Context manager catching SIGTERM and SIGINT for the duration of training."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.received: Optional[str] = None
        self._previous = {}

    def __enter__(self):
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name
        for sig in self.SIGNALS:  # a second signal must not wait for the step to finish
            signal.signal(sig, signal.SIG_DFL)
        print(f"\n[llama-npu] {self.received} received: finishing this step and saving a checkpoint "
              f"(send it again to exit at once; the last complete checkpoint stays intact)", flush=True)


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
    from mindspore import ops

    return all(bool(ops.isfinite(p).all()) for p in params)
