"""What an objective gives a run's session (objectives/__init__.py `parts`): its loss cell,
what a micro-batch's loss is a sum over, and, where it has them, its per-step metrics, its
preparation of a step's micro-batches and its loss on the sharded layout. Pure Python."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional


@dataclass
class ObjectiveParts:
    loss_cell: object  # an nn.Cell: (input_ids, labels, *more[, embeds]) -> the micro-batch's summed loss
    count: Callable  # micro-batch -> what its summed loss is over; the step divides by the step's total
    metrics: Optional[Callable[[], dict]] = None  # this step's metrics by name, read once an optimizer step
    prepare: Optional[Callable[[list], list]] = None  # a step's k micro-batches -> as the step takes them
    sharded: Optional[dict] = None  # ShardedStep's network, count and arrange (steps/sharded_step.py)

    def prepared(self, micro_batches: list) -> list:
        return self.prepare(micro_batches) if self.prepare else micro_batches
