"""Our TrainOneStepCell, split so that k micro-batches make one optimizer step.

MindFormers' GradAccumulationCell only acts in semi-auto/auto parallel mode (FACTS.md), so
a single card or a plain data-parallel job gets no accumulation from it. Here:

- `ForwardBackward` runs one micro-batch and adds the gradients of its *summed* token loss,
  times loss scale / (target tokens of the whole step), into fp32 accumulators;
- `NormalizeGradients` runs once per optimizer step: it all-reduces the accumulators when
  data parallel (one all-reduce per step, not per micro-batch), removes the loss scale and
  returns the global norm;
- `ApplyGradients` clips by the coefficient the loop computed from that norm, runs the
  optimizer and zeroes the accumulators; `ZeroGradients` discards an overflowed step.

The loop decides between the last two from the norm's finiteness, in Python, which keeps
the graphs free of control flow.

Pipeline parallel (Ascend only, never run by CI): the loss cell arrives wrapped in
MindSpore's PipelineCell (parallel.wrap_loss_cell), which splits the step's batch into
`micro_batches` and sums their losses -- our summed token loss is what that sum needs. The
framework then accumulates each micro-batch's gradient into the parameters named
`accu_grads.<weight>` itself (as under nn.PipelineGradReducer and MindFormers'
MFPipelineWithLossScaleCell), so there the accumulators are cloned from the weights and
ForwardBackward does not add into them. Checked against one large-batch step within 4e-9 in
FACTS.md's experiment; tests/test_accumulation.py checks it here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from ..model import IGNORE_ID


def make_accumulators(params, framework_accumulates: bool) -> ParameterTuple:
    # "accu_grads." is the prefix MindSpore's parallel passes recognise gradient buffers by.
    if framework_accumulates:  # same dtype and layout as the weights, as the framework needs
        return ParameterTuple(params).clone(prefix="accu_grads", init="zeros")
    return ParameterTuple(
        Parameter(ops.zeros(p.shape, ms.float32), name=f"accu_grads.{p.name}", requires_grad=False)
        for p in params)


class ForwardBackward(nn.Cell):
    def __init__(self, loss_cell: nn.Cell, params, accumulators: ParameterTuple, framework_accumulates: bool):
        super().__init__(auto_prefix=False)
        self.loss_cell = loss_cell
        self.params = ParameterTuple(params)
        self.accumulators = accumulators
        self.framework_accumulates = framework_accumulates
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)

    def construct(self, sens, *batch):
        loss = self.loss_cell(*batch)
        # Backpropagating `sens` gives the gradients of loss x sens in one pass.
        grads = self.grad(self.loss_cell, self.params)(*batch, sens.astype(loss.dtype))
        if self.framework_accumulates:
            return ops.depend(loss, grads)
        for acc, grad in zip(self.accumulators, grads):
            ops.assign_add(acc, grad.astype(ms.float32))
        return loss


class NormalizeGradients(nn.Cell):
    def __init__(self, accumulators: ParameterTuple, reducer=None):
        super().__init__(auto_prefix=False)
        self.accumulators = accumulators
        self.reducer = reducer

    def construct(self, token_share, inverse_scale):
        """token_share: this rank's target tokens / all ranks' (1 on one device)."""
        grads = self.accumulators
        if self.reducer is not None:
            # Each rank's accumulator is its own token mean; weighting by the token share and
            # summing gives the mean over every target token of the step.
            grads = self.reducer(tuple(g * token_share for g in grads))
        total = ops.zeros((), ms.float32)
        for acc, grad in zip(self.accumulators, grads):
            scaled = grad * inverse_scale
            ops.assign(acc, scaled)
            total = total + (scaled * scaled).sum()
        return ops.sqrt(total)


class SumAcrossRanks(nn.Cell):
    """All-reduce (sum) of a small vector: the step's loss sum and token count."""

    def __init__(self):
        super().__init__()
        self.all_reduce = ops.AllReduce()

    def construct(self, values):
        return self.all_reduce(values)


class ZeroGradients(nn.Cell):
    def __init__(self, accumulators: ParameterTuple):
        super().__init__(auto_prefix=False)
        self.accumulators = accumulators

    def construct(self):
        for acc in self.accumulators:
            ops.assign(acc, ops.zeros_like(acc))
        return True


class ApplyGradients(nn.Cell):
    def __init__(self, optimizer: nn.Optimizer, accumulators: ParameterTuple, params):
        super().__init__(auto_prefix=False)
        self.optimizer = optimizer
        self.accumulators = accumulators
        self.param_dtypes = tuple(p.dtype for p in params)
        self.zero = ZeroGradients(accumulators)

    def construct(self, clip_coefficient):
        grads = ()
        for acc, dtype in zip(self.accumulators, self.param_dtypes):
            grads += ((acc * clip_coefficient).astype(dtype),)
        # Auto-monad orders side effects as written: the update reads the accumulators
        # before they are zeroed.
        self.optimizer(grads)
        return self.zero()


@dataclass
class StepResult:
    loss: float  # mean loss per target token over the whole optimizer step
    target_tokens: int
    grad_norm: float  # after unscaling and normalising, before clipping
    overflow: bool  # non-finite gradients: the update was skipped
    loss_scale: float  # the scale this step used
    stop_requested: bool  # some rank asked to stop after this step (a signal)


class TrainStep:
    """One optimizer step over a list of micro-batches (k = len(micro_batches))."""

    def __init__(self, loss_cell, optimizer, scaler, grad_clip: float, reducer=None,
                 framework_accumulates: bool = False):
        # The optimizer may have regrouped the parameters; gradients must follow its order.
        params = optimizer.parameters
        accumulators = make_accumulators(params, framework_accumulates)
        self.forward_backward = ForwardBackward(loss_cell, params, accumulators, framework_accumulates)
        self.normalize = NormalizeGradients(accumulators, reducer)
        self.apply = ApplyGradients(optimizer, accumulators, params)
        self.discard = ZeroGradients(accumulators)
        self.sum_across_ranks = SumAcrossRanks() if reducer is not None else None
        self.optimizer = optimizer
        self.scaler = scaler
        self.grad_clip = grad_clip

    def __call__(self, micro_batches, lr: float, stop_requested: bool = False) -> StepResult:
        scale = self.scaler.scale
        tokens = sum(int((batch[1][:, 1:] != IGNORE_ID).sum()) for batch in micro_batches)
        # Dividing by the step's token count inside the backward pass keeps fp16 gradients
        # at the magnitude of a mean loss (a sum over thousands of tokens would overflow);
        # the loss scale is taken out once the window is complete.
        sens = Tensor(scale / max(tokens, 1), ms.float32)
        loss_sum = 0.0
        for batch in micro_batches:  # (input_ids, labels[, segment_ids]) numpy arrays
            loss_sum += float(self.forward_backward(sens, *map(Tensor, batch)).asnumpy())
        local_tokens = tokens
        if self.sum_across_ranks is not None:
            # The stop request rides along, so every rank sees the same answer for this step.
            loss_sum, tokens, stops = (float(v) for v in self.sum_across_ranks(
                Tensor([loss_sum, tokens, float(stop_requested)], ms.float32)).asnumpy())
            tokens, stop_requested = int(round(tokens)), stops > 0
        share = Tensor(local_tokens / max(tokens, 1), ms.float32)
        grad_norm = float(self.normalize(share, Tensor(1.0 / scale, ms.float32)).asnumpy())
        overflow = not math.isfinite(grad_norm) or not math.isfinite(loss_sum)
        if overflow:
            self.discard()
        else:
            coefficient = 1.0
            if self.grad_clip > 0 and grad_norm > self.grad_clip:
                coefficient = self.grad_clip / (grad_norm + 1e-6)
            self.optimizer.learning_rate.set_data(Tensor(lr, ms.float32))
            self.apply(Tensor(coefficient, ms.float32))
        self.scaler.update(overflow)
        return StepResult(loss_sum / max(tokens, 1), tokens, grad_norm, overflow, scale, stop_requested)
