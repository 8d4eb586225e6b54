"""What checkpoints/ needs of a run's train step, and nothing more: `Checkpointed`.

checkpoints/ owns this contract and imports nothing from the steps that implement it
(llama_npu/steps/: the in-graph step, the sharded step, the host step). A step answers it
whatever keeps its weights and optimizer states: the graph's Parameters (saved and loaded
by MindSpore), or fp32 ranges on the host (steps/host/), where saving gathers every rank's
range and loading reads the whole files a tensor at a time.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol


class Checkpointed(Protocol):
    """A train step as checkpoints/ sees it."""

    states_in_ranges: bool
    """Each rank holds a range of the weights and states (the host optimizer under data
    parallel): saving is a collective that gathers them whole to rank 0, and loading reads
    the whole files one rank at a time, so a node's host holds one copy at a time."""

    def states_to_save(self) -> tuple[list, object]:
        """(the weights, the Cell whose other Parameters are the optimizer's states) that this
        rank writes. Under `states_in_ranges` a collective: every rank calls it."""

    def compile_before_load(self, example_batches: Callable[[], list]) -> None:
        """Compile the graph ahead of a resume when loading needs the compiled Parameters'
        shapes (a sharded graph slices each to this rank's shard); else nothing.
        `example_batches()` gives one step's micro-batches of the run's shapes."""

    def load_from(self, path: Path) -> dict:
        """Load the checkpoint directory `path`'s weights and optimizer states, checked as
        they are read (checkpoints/files.py's CheckpointError when damaged or of another model);
        return its state.json."""

    def after_load(self) -> None:
        """Once every rank loaded: whatever must follow the loaded states (the host step
        pushes its loaded masters, halved, onto the card)."""

    def loss_scale_state(self) -> dict:
        """The loss scale and its clean-step count, for state.json."""

    def load_loss_scale_state(self, state: dict) -> None:
        """Restore what loss_scale_state gave."""
