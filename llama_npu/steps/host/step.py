"""The train step with the optimizer on the host (strategies.offload.optimizer: host).

Each micro-batch is one graph, `HostMicroStep`: steps/graph_step.py's MicroStep (the same seeded
backward, the same overflow detection, the embedding's gradient as rows) that outputs the
compute-dtype gradients instead of adding them into device accumulators; the host adds them
into its fp32 accumulators (steps/host/optimizer.py). Its overflow flag and loss go into
the device's step buffers. At the step's end a small graph, `StepEnd`, combines the flags
across ranks and runs the loss-scale update cell on the device, exactly as FinalMicroStep
does; the host then unscales, clips and updates unless the step overflowed, and pushes the
new compute-dtype weights into the card's Parameters before the next forward. Under data
parallel each micro-batch's gradients are all-reduced on the card and only this rank's ranges
leave it (steps/host/shards.py), the sum of squares of the global norm is summed over the
ranks by StepEnd, and the card gathers the updated weights from every rank's range.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import ParameterTuple, Tensor, nn, ops

from ...checkpoints.files import OPTIMIZER, WEIGHTS, CheckpointError, read_state
from ...objectives.sft import target_tokens
from ...weights.tensor_files import ConvertError, ckpt_index
from ..contract import Step, StepResult
from ..graph_step import ISFINITE, Buffers, MicroStep, _self_dot
from .optimizer import HostAdamW


class CardWeights:
    """What nn.TrainOneStepCell reads of its optimizer: the weights to differentiate."""

    def __init__(self, params):
        self.parameters = ParameterTuple(params)


class HostMicroStep(MicroStep):
    """One micro-batch: (summed loss, gradients of loss x scale / the step's tokens in each
    weight's dtype, the embedding's gradient rows or an empty tensor)."""

    def __init__(self, network, params, scale_sense):
        # in_place: for MicroStep's unscale and copy, which this step leaves to the host
        super().__init__(network, CardWeights(params), scale_sense, in_place=True)
        self.carry = Buffers(self.weights, self.scale_sense, accumulate=False)
        self.combine_flags = self.is_distributed
        self.is_distributed = False  # the flag is combined across ranks once, by StepEnd
        # Under data parallel, each weight's flat (start, stop) this rank's host keeps
        # (ShardLayout.card_ranges): only they leave the card.
        self.ranges = ()

    def construct(self, token_count, *batch):
        if self.combine_flags:
            # Data parallel: each micro-batch's gradients are summed over the ranks before they
            # leave the card, since each rank's host accumulates only its range of them
            # (steps/host/shards.py). Seeded with scale / the step's tokens over every rank,
            # the sum is one process's gradient of the ranks' micro-batches together; the
            # embedding's rows are added on the card first, as the in-graph k = 1 step adds them.
            token_count = self.allreduce(token_count.reshape((1,)))[0]
        loss, grads, status, rows = self.scaled_gradients(token_count, *batch)
        if self.combine_flags:
            grads = self.grad_reducer(self.add_embedding_rows(grads, batch[0], rows, accumulators=False))
            rows = None
        checked = grads if rows is None else grads + (rows,)
        if self.overflow_check == ISFINITE:
            flag = ops.logical_not(ops.isfinite(ops.addn(self.hyper_map(_self_dot, checked))))
        else:
            flag = self.get_overflow_status(status, checked)
        done = ops.assign(self.carry.overflow, ops.maximum(self.carry.overflow, flag.astype(ms.float32)))
        done = ops.depend(done, ops.assign_add(self.carry.loss, loss.astype(ms.float32)))
        rows = ops.zeros((0,), loss.dtype) if rows is None else rows
        if self.ranges:
            grads = self.kept(grads)
        return ops.depend(loss, done), grads, rows

    def kept(self, grads):
        """Each gradient's flat range this rank's host keeps, so a card sends its host 1/N of
        the gradients, not all of them."""
        out = ()
        for i in range(len(self.ranges)):
            start, stop = self.ranges[i]
            out = out + (grads[i].reshape((-1,))[start:stop],)
        return out


class StepEnd(nn.Cell):
    """The device's part of the step's end: the step's loss, tokens, stop request, overflow
    flag and the host's sum of squares of the gradients (all-reduced under data parallel), the loss-scale update, the buffers cleared. As
    FinalMicroStep's tail (steps/graph_step.py); the loss-scale cell is the micro-step's."""

    def __init__(self, micro: HostMicroStep):
        super().__init__(auto_prefix=False)
        self.carry = micro.carry
        self.scale_sense = micro.scale_sense
        self.loss_scaling_manager = micro.loss_scaling_manager
        self.distributed = micro.combine_flags
        self.allreduce = ops.AllReduce()

    def construct(self, token_count, stop, square_sum):
        scale = self.scale_sense * 1.0  # the scale this step used, read before its update
        flags = ops.stack([self.carry.loss * 1.0, token_count, stop, self.carry.overflow * 1.0, square_sum])
        if self.distributed:
            flags = self.allreduce(flags)
        overflow = ops.logical_or(flags[3] > 0, ops.logical_not(ops.isfinite(flags[0])))
        if self.loss_scaling_manager is not None:
            overflow = self.loss_scaling_manager(self.scale_sense, overflow)
        done = ops.assign(self.carry.loss, ops.zeros_like(self.carry.loss))
        done = ops.depend(done, ops.assign(self.carry.overflow, ops.zeros_like(self.carry.overflow)))
        out = ops.stack([flags[0], flags[1], overflow.astype(ms.float32), scale, flags[2], flags[4]])
        return ops.depend(out, done)


class HostStep(Step):
    """One optimizer step over a list of micro-batches, the update on the host; called as
    steps/graph_step.py's TrainStep is."""

    def __init__(self, loss_cell, host: HostAdamW, scaler, grad_clip: float, accumulation_steps: int = 1,
                 count=target_tokens):
        self.micro = HostMicroStep(loss_cell, host.card, scaler.sense())
        if host.sharded:
            self.micro.ranges = host.layout.card_ranges()
        self.end = StepEnd(self.micro)
        self.host, self.scaler, self.grad_clip = host, scaler, grad_clip
        self.accumulation_steps, self.count = accumulation_steps, count
        self.optimizer, self.states_in_ranges = host, host.sharded

    @property
    def params(self) -> list:
        """The fp32 masters on one card; under data parallel, where each rank holds a range of
        them, the card's whole weights."""
        return self.host.card if self.host.sharded else self.host.master_params

    def __call__(self, micro_batches, lr: float, stop_requested: bool = False) -> StepResult:
        if len(micro_batches) != self.accumulation_steps:
            raise ValueError(f"{len(micro_batches)} micro-batches for a step built for {self.accumulation_steps}")
        tokens = Tensor(sum(self.count(b) for b in micro_batches), ms.float32)
        index = self.micro.embedding_index
        rows_out = index >= 0 and not self.micro.combine_flags  # under data parallel the card added them
        for batch in micro_batches:
            _, grads, rows = self.micro(tokens, *map(Tensor, batch))
            self.host.accumulate(grads, index, batch[0][:, :-1], rows if rows_out else None)
            del grads, rows  # freed before the next micro-batch's: the card holds one set, as planned
        # The sum of squares of the ranks' ranges, summed by StepEnd's all-reduce: the global norm.
        out = self.end(tokens, Tensor(float(stop_requested), ms.float32), Tensor(self.host.square_sum(), ms.float32))
        loss_sum, token_total, overflow, scale, stops, square_sum = (float(v) for v in out.asnumpy())
        norm = self.host.step(lr, scale, self.grad_clip, overflow > 0, square_sum)
        token_total = int(round(token_total))
        return StepResult(loss_sum / max(token_total, 1), token_total, norm, overflow > 0, scale, stops > 0, lr)

    def loss_scale_state(self) -> dict:
        return self.scaler.state(self.micro)

    def load_loss_scale_state(self, state: dict) -> None:
        self.scaler.load_state(self.micro, state)

    # The checkpoint side (checkpoints/contract.py): the states are the host's, not the graph's.
    def states_to_save(self) -> tuple[list, nn.Cell]:
        return self.host.whole_states()

    def load_from(self, path) -> dict:
        """This rank's ranges of the checkpoint's tensors, read a tensor at a time from the
        files' headers (the directory's checksums were verified before the resume chose it)."""
        state = read_state(path)
        if state is None:
            raise CheckpointError(f"{path} is not a complete checkpoint")
        try:
            wrong = self.host.load_whole(ckpt_index(path / WEIGHTS), ckpt_index(path / OPTIMIZER))
        except (ValueError, EOFError, OSError, ConvertError) as exc:
            raise CheckpointError(f"{path} is damaged or unreadable ({exc})") from exc
        if wrong:
            raise CheckpointError(f"{path} lacks trained weights or optimizer states of this model's sizes: "
                                  f"{', '.join(wrong[:5])}")
        return state

    def after_load(self) -> None:
        self.host.loaded()  # the loaded masters, halved, onto the card
