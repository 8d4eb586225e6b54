"""Optimizers and the learning-rate schedule.

The learning rate is computed here in Python for every step and written into the
optimizer's learning-rate Parameter, so the schedule is a pure function of the step and a
resumed run needs nothing but the step number to continue it.
"""
from __future__ import annotations

import math

from .recipe import TrainSection


def lr_at(step: int, train: TrainSection) -> float:
    """Learning rate of optimizer step `step` (1-based): linear warm-up, then cosine decay
    to min_lr_ratio x lr at max_steps."""
    base = train.optimizer.lr
    if train.warmup_steps and step <= train.warmup_steps:
        return base * step / train.warmup_steps
    span = max(train.max_steps - train.warmup_steps, 1)
    progress = min(max(step - train.warmup_steps, 0) / span, 1.0)
    floor = base * train.min_lr_ratio
    return floor + (base - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(params, train: TrainSection):
    """AdamW (moments kept in the parameters' dtype: fp32 under O0-O2) or plain SGD.
    Weight decay applies to matrices only, never to the RMSNorm gains."""
    from mindspore import nn

    o = train.optimizer
    if o.name == "sgd":
        return nn.SGD(params, learning_rate=o.lr, momentum=0.0, weight_decay=0.0)
    matrices = [p for p in params if len(p.shape) >= 2]
    vectors = [p for p in params if len(p.shape) < 2]
    groups = [{"params": matrices, "weight_decay": o.weight_decay}]
    if vectors:
        groups.append({"params": vectors, "weight_decay": 0.0})
    return nn.AdamWeightDecay(groups, learning_rate=o.lr, beta1=o.beta1, beta2=o.beta2, eps=o.eps)
