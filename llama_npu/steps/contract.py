"""The train step's contract: `Step`, what the loop and checkpoints/ ask of every kind of
step, and `StepResult`, what one step reports.

A step takes one optimizer step's micro-batches and the step's learning rate and updates the
weights, wherever its optimizer runs. `Step` is an abstract base: a kind of step implements
`__call__` and the loss-scale pair, and inherits the checkpoint side for weights and states
that are the graph's own Parameters (MindSpore's save and load, checkpoints/files.py); a step
whose states live elsewhere (steps/host/) overrides that side. Pure Python, so validate and
plan import steps/ without MindSpore.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..checkpoints.files import load_checkpoint


@dataclass
class StepResult:
    loss: float  # mean loss per target token over the whole optimizer step
    target_tokens: int
    grad_norm: float  # after unscaling and normalising, before clipping
    overflow: bool  # non-finite gradients: the update was skipped
    loss_scale: float  # the scale this step used
    stop_requested: bool  # some rank asked to stop after this step (a signal)
    lr: float  # the learning rate of this step's update (the one it would have had, when skipped)


class Step(ABC):
    """One optimizer step over a list of micro-batches, and its side of checkpoints/contract.py.

    What a kind of step sets: `network` (the model whose weights a checkpoint holds, None
    where only the loss cell is at hand: such a step is not checkpointed) and `optimizer` (the
    Cell whose Parameters other than the weights are the optimizer's states); `params`, the
    trainable parameters this rank holds (checked finite before a save, digested into a
    multi-rank summary), defaults to the network's."""

    network = None
    optimizer = None
    states_in_ranges = False  # checkpoints/contract.py: only the host step under data parallel

    @property
    def params(self) -> list:
        return self.network.trainable_params()

    @abstractmethod
    def __call__(self, micro_batches, lr: float, stop_requested: bool = False) -> StepResult:
        """Take one optimizer step over `micro_batches` (the accumulation steps the step was
        built for, each (input_ids, labels[, segment_ids]) numpy arrays); `stop_requested`:
        this rank's stop request, which the result says whether any rank made."""

    @abstractmethod
    def loss_scale_state(self) -> dict:
        """The loss scale and its clean-step count, for state.json."""

    @abstractmethod
    def load_loss_scale_state(self, state: dict) -> None:
        """Restore what loss_scale_state gave."""

    def states_to_save(self) -> tuple[list, object]:
        return self.params, self.optimizer

    def compile_before_load(self, example_batches: Callable[[], list]) -> None:
        """Nothing: the graph compiles at its first call, after the load."""

    def load_from(self, path: Path) -> dict:
        return load_checkpoint(path, self.network, self.optimizer)

    def after_load(self) -> None:
        """Nothing: MindSpore loaded the Parameters the graph reads."""
