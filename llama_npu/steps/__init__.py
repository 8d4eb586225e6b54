"""Every way a train step updates the weights, behind one contract.

- `Step` (steps/contract.py): what the loop and checkpoints/ ask of a step -- take one
  optimizer step's micro-batches and report a `StepResult` (loss, lr, grad norm, overflow,
  loss scale, stop request); its loss scale's state; and checkpoints/contract.py's side: what
  to save, compiling ahead of a resume, loading, what follows a load. An abstract base: a
  kind of step implements the call and the loss-scale pair and inherits the rest.
- `build_step(...)`: the run's step, chosen from the recipe and the layout.

The kinds: the in-graph step (graph_step.py: the update in the graph, our own accumulation
cells), the sharded step (sharded_step.py: MindFormers' wrapper chain for operator-sharded
and pipeline layouts), the host step (host/: the fp32 states and AdamW on the host, the card
holding compute-dtype weights); the graph optimizer they share is optimizer.py.
docs/architecture.md, "Adding a kind of step", says what a new one implements.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .contract import Step, StepResult

if TYPE_CHECKING:  # for the annotations only: the steps load MindSpore, which validate and plan need not
    from ..objectives.parts import ObjectiveParts
    from ..recipe.schema import Recipe
    from ..strategies.parallel import World
    from ..strategies.precision import LossScaler

__all__ = ["Step", "StepResult", "build_step"]


def build_step(recipe: Recipe, net, objective: ObjectiveParts, scaler: LossScaler, world: World,
               schedule_steps: int) -> Step:
    """The run's step for `net` (the model, built by strategies/network.py) and the
    objective's loss cell: the host step where the recipe puts the optimizer on the host, the
    sharded step for an operator-sharded or pipeline layout, else the in-graph step.
    `schedule_steps`: the learning-rate schedule's length (recipe/resume_checks.py)."""
    from ..strategies.accumulation import accumulation_steps
    from .host.build import host_optimizer

    t, k, params = recipe.train, accumulation_steps(recipe), net.trainable_params()
    host = host_optimizer(recipe, params, world)  # the fp32 masters and moments on the host, the card's copies halved
    if host is not None:
        from .host.step import HostStep

        return HostStep(objective.loss_cell, host, scaler, t.grad_clip, k, count=objective.count)
    from .optimizer import build_optimizer

    # Sharded layouts step through MindFormers' wrappers, which need the schedule in the graph.
    optimizer = build_optimizer(params, t, schedule_in_graph=world.sharded, schedule_steps=schedule_steps)
    if world.sharded:
        from .sharded_step import ShardedStep

        return ShardedStep(net, optimizer, scaler, recipe, k, **(objective.sharded or {}))
    from .graph_step import TrainStep

    return TrainStep(objective.loss_cell, optimizer, scaler, t.grad_clip, k, count=objective.count, network=net)
