"""AdamW on the host (strategies/offload.py): the fp32 master weights, the moments and the fp32
gradient accumulators in host memory, the update by torch's fused CPU AdamW kernel.

The formula is the one the same recipe runs in the graph, MindSpore's nn.AdamWeightDecay
(mindspore/nn/optim/adam.py _update_run_op: no bias correction, decoupled decay on the
matrices only, training/optimizer.py), with g the unscaled, clipped gradient:

    m <- b1 m + (1 - b1) g
    v <- b2 v + (1 - b2) g^2
    w <- w - lr (m / (sqrt(v) + eps) + wd w)

torch's AdamW (aten _fused_adamw_, its CPU kernel) corrects the bias at step t with
c1 = 1 - b1^t, c2 = 1 - b2^t and decays with its own lr and wd:

    w <- w (1 - lr' wd') - (lr' / c1) m / (sqrt(v) / sqrt(c2) + eps')

Its step counter is held at t = 1 (the kernel reads it, torch.optim increments it, we do
not), so c1 = 1 - b1 and c2 = 1 - b2 are fixed, and we pass

    lr' = lr c1 / sqrt(c2),   eps' = eps / sqrt(c2),   wd' = lr wd / lr'

which gives (lr' / c1) m / (sqrt(v) / sqrt(c2) + eps') = lr m / (sqrt(v) + eps) and
1 - lr' wd' = 1 - lr wd: MindSpore's update, rounded in another order (fp32, about 1e-7).

The states are MindSpore Parameters named as the in-graph optimizer names them (the master
by the weight's name, `adam_m.`/`adam_v.` + name, `global_step`, `learning_rate`), held by
this Cell, so checkpoints/files.py saves and loads them as it does the in-graph ones and a
run resumes across the switch; the torch tensors are views of their host memory. No graph
ever reads them: the card's Parameters keep only the compute-dtype copy this pushes to them.
"""
from __future__ import annotations

import math

import numpy as np
import torch

import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn

from ..recipe.schema import OptimizerSection

BIAS_STEP = 1.0  # the step torch's kernel corrects the bias for: see the module's docstring


def is_matrix(param) -> bool:
    """Decayed, and held in the compute dtype on the card; vectors (the RMSNorm gains) are
    neither, as in training/optimizer.py."""
    return len(param.shape) >= 2


class HostAdamW(nn.Cell):
    """The host's states for the card's trainable Parameters `card` (built fp32, as without
    offload): copies them as the fp32 masters, then leaves the card the matrices in
    `compute_dtype`."""

    def __init__(self, card, section: OptimizerSection, threads: int, compute_dtype):
        super().__init__(auto_prefix=False)
        self.card = list(card)
        self.masters = ParameterTuple(Parameter(Tensor(p.asnumpy().astype(np.float32)), name=p.name)
                                      for p in self.card)
        self.moments1 = ParameterTuple(Parameter(Tensor(np.zeros(p.shape, np.float32)), name=f"adam_m.{p.name}",
                                                 requires_grad=False) for p in self.card)
        self.moments2 = ParameterTuple(Parameter(Tensor(np.zeros(p.shape, np.float32)), name=f"adam_v.{p.name}",
                                                 requires_grad=False) for p in self.card)
        self.global_step = Parameter(Tensor([0], ms.int32), name="global_step", requires_grad=False)
        self.learning_rate = Parameter(Tensor(section.lr, ms.float32), name="learning_rate", requires_grad=False)
        self.section = section
        self.card_dtypes = [compute_dtype if is_matrix(p) else ms.float32 for p in self.card]
        self.accumulators = [torch.zeros(p.shape, dtype=torch.float32) for p in self.card]
        self.steps = [torch.tensor(BIAS_STEP) for _ in self.card]
        torch.set_num_threads(threads)
        self.bind()
        self.push()

    @property
    def master_params(self) -> list:
        return list(self.masters)

    def bind(self) -> None:
        """torch views of the states' host memory; again after a checkpoint load replaced them."""
        view = lambda p: torch.from_numpy(p.asnumpy())  # noqa: E731 -- asnumpy shares a CPU tensor's memory
        self.weights = [view(p) for p in self.masters]
        self.exp_avgs = [view(p) for p in self.moments1]
        self.exp_avg_sqs = [view(p) for p in self.moments2]

    def push(self) -> None:
        """The masters, cast to the card's dtypes, into the card's Parameters: the next forward
        reads them (a host write of a Parameter that a graph reads unconditionally is seen by its
        next run, MindSpore 2.9.0; tests/test_offload.py checks the losses). assign_value is what
        Parameter.set_data ends in (mindspore/common/parameter.py _update_tensor_data), without
        set_data's cast back to the Parameter's dtype: the first push turns the matrices, built
        fp32, into compute-dtype Parameters (the test counts the graph's fp16 matrices)."""
        for param, master, dtype in zip(self.card, self.masters, self.card_dtypes):
            param.assign_value(Tensor(master.asnumpy(), dtype=dtype))

    def loaded(self) -> None:
        """After checkpoints/files.py loaded the states into this Cell."""
        self.bind()
        self.push()

    def accumulate(self, grads, embedding_index: int = -1, tokens=None, rows=None) -> None:
        """Add one micro-batch's gradients (the card's outputs, compute dtype) into the fp32
        accumulators; `rows` (B, T, H), the tied embedding's lookup gradient, added at the
        rows of `tokens` (B, T) in fp32, as the in-graph step adds them into fp32 gradients."""
        for acc, grad in zip(self.accumulators, grads):
            acc.add_(torch.from_numpy(grad.asnumpy()))
        if rows is not None:
            width = rows.shape[-1]
            index = torch.from_numpy(tokens.reshape(-1).astype(np.int64))
            added = torch.from_numpy(rows.asnumpy().reshape(-1, width)).to(torch.float32)
            self.accumulators[embedding_index].index_add_(0, index, added)

    def square_sum(self) -> float:
        """The accumulators' sum of squares, summed in fp32 tensor by tensor as the in-graph
        step does (training/step.py _self_dot, then AddN)."""
        total = torch.zeros((), dtype=torch.float32)
        for acc in self.accumulators:
            flat = acc.reshape(-1)
            total += torch.dot(flat, flat)
        return float(total)

    def step(self, lr: float, scale: float, grad_clip: float, overflow: bool) -> float:
        """Unscale, clip and update unless `overflow`; zero the accumulators. Returns the
        gradients' global norm after unscaling, before clipping."""
        f32 = np.float32
        norm = f32(math.sqrt(self.square_sum())) / f32(scale)
        self.learning_rate.asnumpy()[...] = lr  # assigned every step, as the in-graph step does
        if not overflow:
            factor = f32(1.0) / f32(scale)
            if grad_clip > 0 and norm > f32(grad_clip):
                factor = factor * (f32(grad_clip) / (norm + f32(1e-6)))
            for acc in self.accumulators:
                acc.mul_(float(factor))
            self.update(lr)
            self.push()
        for acc in self.accumulators:
            acc.zero_()
        return float(norm)

    def update(self, lr: float) -> None:
        o = self.section
        c1, c2 = 1.0 - o.beta1 ** BIAS_STEP, 1.0 - o.beta2 ** BIAS_STEP
        lr_t, eps_t = lr * c1 / math.sqrt(c2), o.eps / math.sqrt(c2)
        for decayed in (True, False):
            chosen = [i for i, p in enumerate(self.card) if is_matrix(p) == decayed]
            if not chosen:
                continue
            decay = lr * (o.weight_decay if decayed else 0.0) / lr_t if lr_t else 0.0
            pick = lambda tensors: [tensors[i] for i in chosen]  # noqa: E731
            torch._fused_adamw_(pick(self.weights), pick(self.accumulators), pick(self.exp_avgs),
                                pick(self.exp_avg_sqs), [], pick(self.steps), lr=lr_t, beta1=o.beta1,
                                beta2=o.beta2, weight_decay=decay, eps=eps_t, amsgrad=False, maximize=False)
        self.global_step.asnumpy()[...] += 1
