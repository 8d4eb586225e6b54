"""Optimizers and the learning-rate schedule.

lr_at(step) is the schedule: a pure function of the optimizer step, so a resumed run needs
nothing but the step number to continue it. Our own train step (steps/graph_step.py)
computes it on the host and feeds it into its graph each step. The sharded layouts train
through MindFormers' wrappers (steps/sharded_step.py), which we do not write: there the
optimizer carries the schedule as a cell (WarmupCosineLR) and evaluates it in the graph from
its own step counter, as MindFormers' optimizers do with their lr_schedule cells.
"""
from __future__ import annotations

import math
from typing import Optional

from mindspore import nn, ops
from mindspore.common import dtype as mstype
from mindspore.nn.learning_rate_schedule import LearningRateSchedule

from ..recipe.schema import TrainSection


def lr_at(step: int, train: TrainSection, steps: Optional[int] = None) -> float:
    """Learning rate of optimizer step `step` (1-based): linear warm-up, then cosine decay
    to min_lr_ratio x lr at `steps` (max_steps; a resumed run's may differ,
    recipe/resume_checks.py), then that floor."""
    base = train.optimizer.lr
    if train.warmup_steps and step <= train.warmup_steps:
        return base * step / train.warmup_steps
    span = max((steps or train.max_steps) - train.warmup_steps, 1)
    progress = min(max(step - train.warmup_steps, 0) / span, 1.0)
    floor = base * train.min_lr_ratio
    return floor + (base - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


class WarmupCosineLR(LearningRateSchedule):
    """lr_at(global_step + 1), evaluated in the graph (float32).

    MindSpore's optimizers read the schedule with their `global_step` Parameter, then add 1
    to it (mindspore/nn/optim/optimizer.py get_lr; adam.py, sgd.py construct): the first
    update reads 0, hence the + 1. They add it only when they run, so a step skipped for
    overflow does not advance the schedule: the next update gets the LR the skipped one would
    have had. MindFormers' CosineWithWarmUpLR (mindformers/core/lr/lr_schedule.py) is not
    used because it is one step behind lr_at: its warm-up starts at 0 (global_step / warmup)
    where our first update already has lr / warmup_steps, and its cosine starts one step
    later; neither warmup_lr_init nor the step counts can shift it onto lr_at exactly."""

    def __init__(self, train: TrainSection, steps: Optional[int] = None):
        super().__init__()
        self.base = float(train.optimizer.lr)
        self.floor = self.base * train.min_lr_ratio
        self.warmup = float(train.warmup_steps)
        self.span = float(max((steps or train.max_steps) - train.warmup_steps, 1))

    def construct(self, global_step):
        step = ops.cast(global_step, mstype.float32) + 1.0
        progress = ops.clamp((step - self.warmup) / self.span, 0.0, 1.0)
        decayed = self.floor + (self.base - self.floor) * 0.5 * (1.0 + ops.cos(math.pi * progress))
        if self.warmup > 0:  # a constant: decided when the graph compiles
            return ops.select(step <= self.warmup, self.base * step / self.warmup, decayed)
        return decayed


def build_optimizer(params, train: TrainSection, schedule_in_graph: bool = False, schedule_steps: Optional[int] = None):
    """AdamW (moments kept in the parameters' dtype: fp32 under O0-O2) or plain SGD.
    Weight decay applies to matrices only, never to the RMSNorm gains.

    The learning rate is a Parameter the train step assigns each step, or, with
    `schedule_in_graph` (the sharded layouts), WarmupCosineLR driven by the optimizer's
    global_step, which optimizer.ckpt carries so a resume continues it."""
    o = train.optimizer
    lr = WarmupCosineLR(train, schedule_steps) if schedule_in_graph else o.lr
    if o.name == "sgd":
        return nn.SGD(params, learning_rate=lr, momentum=0.0, weight_decay=0.0)
    matrices = [p for p in params if len(p.shape) >= 2]
    vectors = [p for p in params if len(p.shape) < 2]
    groups = [{"params": matrices, "weight_decay": o.weight_decay}]
    if vectors:
        groups.append({"params": vectors, "weight_decay": 0.0})
    return nn.AdamWeightDecay(groups, learning_rate=lr, beta1=o.beta1, beta2=o.beta2, eps=o.eps)
