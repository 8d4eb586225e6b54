"""The train step: a subclass of MindSpore's nn.TrainOneStepWithLossScaleCell that runs k
micro-batches as one optimizer step, with overflow, clipping, the conditional update and
the loss-scale update on the device.

Followed: mindspore/nn/wrap/loss_scale.py (TrainOneStepWithLossScaleCell.construct) and
mindformers/wrapper/wrapper.py (MFTrainOneStepCell: clip by global norm, then
`if not overflow: optimizer(grads)`).

- k = 1 is one graph, `FinalMicroStep`: forward, backward of the micro-batch's *summed*
  token loss times loss scale / (target tokens of the step; under data parallel, over every
  rank, a scalar all-reduced before the forward), the data-parallel all-reduce,
  the overflow check, clipping, the conditional update and the loss-scale update. No
  accumulation buffer exists: the gradients exist once, as the input of the clip.
- k > 1 is two graphs, each compiled once. `AccumulatingMicroStep` (micro-batches 1..k-1)
  adds its gradients into fp32 accumulators and its loss into a scalar, and on the register
  path ORs its overflow flag into a device flag. `FinalMicroStep` adds its own gradients
  into the accumulators in place, then all-reduces once, checks, clips, updates and zeroes
  the buffers.
- The update makes no second set of gradients: unscale and clip multiply the gradients (the
  accumulators when k > 1) in place, the all-reduce's output is copied back into the
  accumulators tensor by tensor, and the optimizer takes them as they are where the
  weights' dtype is theirs (docs/memory.md, the update phase; tests/test_strategies.py
  counts the step's parameter-sized tensors in its compiled graph). The factor is fp32 and
  O3's fp16 gradients are multiplied in fp32 (one tensor at a time) and cast back. Where the
  graph compiles for GE (jit level O2, the 910A's default), which has no InplaceMul or
  InplaceCopy adapter, the same products are Mul and Assign (jit_level.py).
- The host reads one small vector per optimizer step (loss, tokens, norm, overflow, scale,
  stop request), never per micro-batch.

Overflow detection is the base class's, chosen from the SoC its __init__ reads
(MSContext.get_ascend_soc_version): the float-status registers on the 910A (saturation
mode: an overflow becomes the largest finite value, so only the registers see it) and on a
910B with MS_ASCEND_CHECK_OVERFLOW_MODE=SATURATION_MODE; AllFinite / is-finite in the
910B's default INFNAN mode. On the CPU backend, where neither the register kernels nor
AllFinite exist and the base class would take the register branch, the check is whether
the gradients' sum of squares (which the global norm needs anyway) is finite. Under data
parallel the flag is combined across ranks as the base class does (on CPU the gradients are
already all-reduced, so every rank computes the same flag). On the register path each
micro-step graph clears the registers before its forward and reads then clears them after
its gradients (MicroStep.clear_registers_before says why).

Sharded layouts (model / pipeline / optimizer sharding, semi-auto parallel) do not use this
cell: they use MindFormers' wrapper chain (strategies/parallel.py).
"""
from __future__ import annotations

import numpy as np

import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore.ops.auto_generate.gen_ops_prim import InplaceCopy, InplaceMul
from mindspore.ops.operations.math_ops import NPUClearFloatStatusV2

from ..common.jit_level import in_place_kernels
from ..objectives.sft import target_tokens
from .contract import Step, StepResult

REGISTERS, INFNAN, ISFINITE = "float-status registers", "INFNAN (AllFinite / IsFinite)", "is-finite reduction"
_add_into = ops.MultitypeFuncGraph("add_into")
_scale_in_place = ops.MultitypeFuncGraph("scale_in_place")
_scale = ops.MultitypeFuncGraph("scale")
_copy_into = ops.MultitypeFuncGraph("copy_into")
_assign_into = ops.MultitypeFuncGraph("assign_into")
_for_optimizer = ops.MultitypeFuncGraph("for_optimizer")
_square_sum = ops.MultitypeFuncGraph("square_sum")
_self_dot = ops.MultitypeFuncGraph("self_dot")
# In-place kernels (aclnnInplaceMul / aclnnInplaceCopy on Ascend; they run on the CPU backend
# in GRAPH_MODE too): mindspore/ops/auto_generate/gen_ops_prim.py InplaceMul, InplaceCopy.
_inplace_mul = InplaceMul()
_inplace_copy = InplaceCopy()
_clear_float_status = NPUClearFloatStatusV2()


@_add_into.register("Tensor", "Tensor")
def _add_into_tensor(accumulator, grad):
    """The accumulator itself, after the gradient is added into it."""
    return ops.depend(accumulator, ops.assign_add(accumulator, grad.astype(accumulator.dtype)))


def _scaled_half(factor, grad):
    """A half gradient times the fp32 factor, multiplied in fp32 and cast back, as MindFormers
    does (mindformers/core/clip_grad.py _apply_global_norm, lines 50-56: cast to the clip
    coefficient's fp32, multiply, cast back; mindformers/wrapper/wrapper.py tensor_grad_scale,
    lines 114-116: the unscale in fp32). In the gradient's fp16 the factor, 1 / scale times the
    clip coefficient, is subnormal from a scale of 2^14 and 0 from 2^25 (2^24 when clipping),
    and the CPU InplaceMul rounds even an fp32 factor to fp16: the update was lost."""
    return (grad.astype(ms.float32) * factor).astype(grad.dtype)


@_scale_in_place.register("Tensor", "Tensor")
def _scale_in_place_tensor(factor, grad):
    """grad x factor (fp32) in the gradient's own buffer where it is fp32."""
    if ops.dtype(grad) == ms.float32:
        return _inplace_mul(grad, factor)
    return _scaled_half(factor, grad)


@_scale.register("Tensor", "Tensor")
def _scale_tensor(factor, grad):
    """grad x factor (fp32) as a new tensor: GE (the 910A's O2) has no InplaceMul adapter."""
    if ops.dtype(grad) == ms.float32:
        return grad * factor
    return _scaled_half(factor, grad)


@_copy_into.register("Tensor", "Tensor")
def _copy_into_tensor(accumulator, reduced):
    """The all-reduced gradient back into its accumulator: each reduced copy lives only until
    it is copied, not beside the whole set of accumulators until the update."""
    return _inplace_copy(accumulator, reduced)


@_assign_into.register("Tensor", "Tensor")
def _assign_into_tensor(accumulator, reduced):
    """As _copy_into with Assign, which GE has an adapter for and InplaceCopy has not."""
    return ops.depend(accumulator, ops.assign(accumulator, reduced))


@_for_optimizer.register("Tensor", "Tensor")
def _for_optimizer_tensor(grad, weight):
    """The gradient in the weight's dtype: a copy only where they differ (O3's half weights
    with fp32 accumulators), the fp32 master weights of O0-O2 take the gradient as it is."""
    if ops.dtype(grad) == ops.dtype(weight):
        return grad
    return ops.cast(grad, ops.dtype(weight))


@_square_sum.register("Tensor")
def _square_sum_tensor(grad):
    return ops.square(grad.astype(ms.float32)).sum()


@_self_dot.register("Tensor")
def _self_dot_tensor(grad):
    """The same sum as one (1 x N) @ (N x 1) MatMul: on the CPU backend BLAS does it several
    times faster than Square + ReduceSum (about 30 ms a step less for 8.3M gradients,
    benchmarks/harness_overhead.py). Not on Ascend, where a float32 MatMul may run in fp16
    (precision_mode allow_fp32_to_fp16 on the 910A) and overflow."""
    flat = grad.astype(ms.float32).reshape(1, -1)
    return ops.matmul(flat, flat.T).reshape(())


class GivenEmbeddings(nn.Cell):
    """The loss cell with the token embeddings as an input: (embeds, *batch) -> summed loss."""

    def __init__(self, loss_cell):
        super().__init__(auto_prefix=False)
        self.loss_cell = loss_cell

    def construct(self, embeds, input_ids, labels, segment_ids=None):
        return self.loss_cell(input_ids, labels, segment_ids, embeds)


class MicroStep(nn.TrainOneStepWithLossScaleCell):
    """What both micro-steps share: the gradients of one micro-batch and the overflow check.

    When the (tied) embedding is trained, the embedding lookup runs outside the
    differentiated function and its gradient comes back as one row per token, added into
    the embedding's gradient at the tokens' rows. Autodiff would make it a dense vocab x
    hidden tensor (the Gather's backward, an UnsortedSegmentSum into zeros) and then add it
    to the head's part (AddN): two passes over 128,256 rows per micro-batch whatever its
    size, most of what a micro-step costs beyond its tokens (benchmarks/grad_accum_overhead.py).
    """

    def __init__(self, network, optimizer, scale_sense, in_place: bool):
        super().__init__(network, optimizer, scale_sense)
        self.overflow_check = overflow_check(self)
        # GE (O2, the 910A's default) has no adapter for the in-place kernels (jit_level.py).
        self.scale_grads = _scale_in_place if in_place else _scale
        self.copy_into = _copy_into if in_place else _assign_into
        # A loss cell other than CausalLMLoss (tests' small cells) has no Llama embedding.
        self.embedding = getattr(getattr(network, "backbone", None), "tok_embeddings", None)
        table = getattr(self.embedding, "embedding_weight", None)
        trained = [i for i, w in enumerate(self.weights) if table is not None and w.name == table.name]
        self.embedding_index = trained[0] if trained else -1
        self.given_embeddings = GivenEmbeddings(network)
        self.grad_and_embeddings = ops.GradOperation(get_all=True, get_by_list=True, sens_param=True)

    def scaled_gradients(self, token_count, *batch):
        """(summed loss, gradients of loss x scale / token_count, register status, the
        embedding's gradient rows (B, T, H) or None when the embedding is frozen)."""
        sens = self.scale_sense / ops.maximum(token_count, 1.0)
        status, batch = self.clear_registers_before(batch)
        if self.embedding_index < 0:
            loss = self.network(*batch)
            return loss, self.grad(self.network, self.weights)(*batch, sens.astype(loss.dtype)), status, None
        embeds = self.embedding(batch[0][:, :-1])
        loss = self.given_embeddings(embeds, *batch)
        inputs, grads = self.grad_and_embeddings(self.given_embeddings, self.weights)(embeds, *batch,
                                                                                      sens.astype(loss.dtype))
        return loss, grads, status, inputs[0]

    def clear_registers_before(self, batch):
        """(status for get_overflow_status, the batch): on the register path the float-status
        registers are cleared before anything reads the batch, so before the forward.

        The 910A saturates an fp16 overflow to a finite value, so only the registers see one in
        the forward (or in the loss, where isfinite cannot). MindSpore 1.x's loss-scale cell
        cleared after the forward (start_overflow_check, still in mindspore/nn/wrap/loss_scale.py
        with that docstring), which loses a forward layer that is not recomputed. MindSpore
        2.9.0's own TrainOneStepWithLossScaleCell.construct no longer calls it: it reads the
        registers after the gradients and clears right after the read
        (_get_ascend_overflow_status_on_saturation_mode), as get_overflow_status does here at the
        end of the step. The clear at the start adds what MindSpore lacks: what ran between two
        steps (the update, an evaluation) is not charged to the next step."""
        status = Tensor([0] * 8, ms.int32)
        if self.overflow_check != REGISTERS:
            return status, batch
        cleared = _clear_float_status(status)
        return status, (ops.depend(batch[0], cleared),) + tuple(batch[1:])

    def add_embedding_rows(self, grads, input_ids, rows, accumulators):
        """`grads` with the embedding rows added at the rows of the tokens the model saw
        (input_ids[:, :-1], as CausalLMLoss reads them): in place into the
        accumulator (ScatterAdd on a Parameter), or into a copy of the step's own gradient
        (TensorScatterAdd: no in-place index-add kernel runs on the CPU backend)."""
        if rows is None:
            return grads
        i = self.embedding_index
        tokens = input_ids[:, :-1]
        if accumulators:
            added = ops.scatter_add(self.carry.gradients[i], tokens, rows.astype(ms.float32))
        else:
            width = rows.shape[-1]
            added = ops.tensor_scatter_add(grads[i], tokens.reshape(-1, 1), rows.reshape(-1, width).astype(grads[i].dtype))
        return grads[:i] + (added,) + grads[i + 1:]


def overflow_check(cell: nn.TrainOneStepWithLossScaleCell) -> str:
    """The detection the base class's SoC attributes select (its get_overflow_status sends
    every target that is neither GPU nor a 910B to the registers, CPU included)."""
    if cell.ascend_910a_target or (cell.ascend_910b_target and cell._ascend_check_overflow_mode == "SATURATION_MODE"):
        return REGISTERS
    if cell.ascend_910b_target or cell.gpu_target:
        return INFNAN
    return ISFINITE


class AccumulatingMicroStep(MicroStep):
    """Micro-batches 1..k-1 of a step: no collective, no update."""

    def __init__(self, network, optimizer, buffers: "Buffers", in_place: bool):
        super().__init__(network, optimizer, Tensor(1.0, ms.float32), in_place)
        self.scale_sense = buffers.scale_sense  # the final step's (device-updated) scale
        self.carry = buffers
        # The flag is combined across ranks once, by the final micro-step.
        self.is_distributed = False

    def construct(self, token_count, *batch):
        loss, grads, status, rows = self.scaled_gradients(token_count, *batch)
        added = self.hyper_map(_add_into, self.carry.gradients, grads)
        loss = ops.depend(loss, self.add_embedding_rows(added, batch[0], rows, accumulators=True))
        if self.overflow_check == REGISTERS:
            # Saturated fp16 values stay finite in the sum: only the registers saw them.
            flag = self.get_overflow_status(status, grads).astype(ms.float32)
            loss = ops.depend(loss, ops.assign(self.carry.overflow, ops.maximum(self.carry.overflow, flag)))
        return ops.depend(loss, ops.assign_add(self.carry.loss, loss.astype(ms.float32)))


class Buffers(nn.Cell):
    """What the device keeps between micro-steps -- the step's loss so far, the register
    overflow flag and, only when accumulating, one fp32 gradient buffer per parameter -- and
    the loss scale both micro-steps read."""

    def __init__(self, params, scale_sense: Parameter, accumulate: bool):
        super().__init__(auto_prefix=False)
        self.scale_sense = scale_sense
        # "accu_grads." is the prefix MindSpore's parallel passes recognise gradient buffers by.
        self.gradients = ParameterTuple(
            Parameter(np.zeros(p.shape, np.float32), name=f"accu_grads.{p.name}", requires_grad=False)
            for p in params) if accumulate else ()
        self.loss = Parameter(Tensor(0.0, ms.float32), name="accu_loss", requires_grad=False)
        self.overflow = Parameter(Tensor(0.0, ms.float32), name="accu_overflow", requires_grad=False)


class FinalMicroStep(MicroStep):
    """The last (at k = 1 the only) micro-batch of a step, and the update."""

    def __init__(self, network, optimizer, scale_sense, grad_clip: float, accumulate: bool, in_place: bool):
        super().__init__(network, optimizer, scale_sense, in_place)
        self.grad_clip = float(grad_clip)
        self.accumulate = accumulate
        self.carry = Buffers(self.weights, self.scale_sense, accumulate)

    def construct(self, lr, token_count, stop, *batch):
        # The learning rate goes in as an input: a host-side set_data of a Parameter that only
        # the `if not overflow` branch reads is not seen by the compiled graph (MindSpore 2.9.0,
        # checked on CPU), so the schedule would freeze at the compiling step's value.
        lr = ops.assign(self.optimizer.learning_rate, lr)
        scale = ops.depend(self.scale_sense * 1.0, lr)  # the scale this step used, read before its update
        seed_count = token_count
        if self.is_distributed and not self.accumulate:
            # One micro-batch a rank: seed the backward with scale / the step's tokens over every
            # rank, as one process seeds each of its micro-batches, so the all-reduced sum is its
            # accumulated sum bit for bit. A per-rank seed rounds differently in an fp16 backward
            # (an O2 LoRA run drifted 1.6e-4 in loss over 4 steps: tests/test_int8.py's launch).
            seed_count = self.allreduce(token_count.reshape((1,)))[0]
        loss, grads, status, rows = self.scaled_gradients(seed_count, *batch)
        flags = ops.stack([self.carry.loss + loss.astype(ms.float32), token_count, stop,
                           self.carry.overflow])
        if self.accumulate:
            # In place: the accumulators are the step's gradients, no second fp32 copy.
            grads = self.hyper_map(_add_into, self.carry.gradients, grads)
        grads = self.add_embedding_rows(grads, batch[0], rows, accumulators=self.accumulate)
        if self.is_distributed:
            flags = self.allreduce(flags)
            if self.accumulate:
                # Each rank's gradients are its own token mean; weighting by the rank's share of the
                # step's target tokens and summing gives the mean over every target token.
                share = token_count / ops.maximum(flags[1], 1.0)
                grads = self.hyper_map(ops.partial(self.scale_grads, share), grads)
            reduced = self.grad_reducer(grads)
            grads = self.hyper_map(self.copy_into, self.carry.gradients, reduced) if self.accumulate else reduced
        if self.overflow_check == ISFINITE:
            square_sum = ops.addn(self.hyper_map(_self_dot, grads))
            # One reduction serves the norm and the check: the sum of squares is finite only
            # if every gradient is (after the all-reduce, so every rank sees the same).
            overflow = ops.logical_not(ops.isfinite(square_sum))
        else:
            square_sum = ops.addn(self.hyper_map(_square_sum, grads))
            overflow = self.get_overflow_status(status, grads)
        overflow = ops.logical_or(overflow, flags[3] > 0)
        overflow = ops.logical_or(overflow, ops.logical_not(ops.isfinite(flags[0])))
        norm = ops.sqrt(square_sum) / scale
        factor = 1.0 / scale
        if self.grad_clip > 0:
            factor = factor * ops.select(norm > self.grad_clip, self.grad_clip / (norm + 1e-6), ops.ones_like(norm))
        # Unscaled and clipped in place, then handed over in the weights' dtype: the update
        # allocates no second set of gradients (docs/memory.md, the update phase).
        grads = self.hyper_map(ops.partial(self.scale_grads, factor), grads)
        grads = self.hyper_map(_for_optimizer, grads, self.weights)
        overflow = self.process_loss_scale(overflow)
        if not overflow:
            norm = ops.depend(norm, self.optimizer(grads))
        norm = ops.depend(norm, self.clear())
        return ops.stack([flags[0], flags[1], norm, overflow.astype(ms.float32), scale, flags[2]])

    def clear(self):
        done = ops.assign(self.carry.loss, ops.zeros_like(self.carry.loss))
        done = ops.depend(done, ops.assign(self.carry.overflow, ops.zeros_like(self.carry.overflow)))
        for acc in self.carry.gradients:
            done = ops.depend(done, ops.assign(acc, ops.zeros_like(acc)))
        return done


class TrainStep(Step):
    """One optimizer step over a list of micro-batches: len(micro_batches) must be the
    `accumulation_steps` the step was built for."""

    def __init__(self, loss_cell, optimizer, scaler, grad_clip: float, accumulation_steps: int = 1,
                 in_place: bool | None = None, count=target_tokens, network=None):
        """`in_place`: unscale, clip and copy with in-place kernels; by default where the jit
        level MindSpore will compile with allows them (jit_level.in_place_kernels). `count`:
        what a micro-batch's summed loss is a sum over (target tokens; an objective's items, objectives/).
        `network`: the model a checkpoint saves and loads (steps/contract.py)."""
        in_place = in_place_kernels() if in_place is None else in_place
        self.final = FinalMicroStep(loss_cell, optimizer, scaler.sense(), grad_clip, accumulation_steps > 1, in_place)
        self.accumulating = (AccumulatingMicroStep(loss_cell, optimizer, self.final.carry, in_place)
                             if accumulation_steps > 1 else None)
        for cell in filter(None, (self.final, self.accumulating)):  # a Cell's own jit config outranks the context's
            if in_place and not in_place_kernels(cell):
                raise ValueError(f"{type(cell).__name__} has its own jit config {cell.jit_config_dict}, which compiles "
                                 f"for GE: it has no InplaceMul or InplaceCopy (common/jit_level.py)")
        self.network, self.optimizer = network, optimizer
        self.scaler = scaler
        self.accumulation_steps = accumulation_steps
        self.count = count

    def __call__(self, micro_batches, lr: float, stop_requested: bool = False) -> StepResult:
        if len(micro_batches) != self.accumulation_steps:
            raise ValueError(f"{len(micro_batches)} micro-batches for a step built for {self.accumulation_steps}")
        # Dividing by the step's token count inside the backward pass keeps fp16 gradients
        # at the magnitude of a mean loss (a sum over thousands of tokens would overflow).
        tokens = Tensor(sum(self.count(b) for b in micro_batches), ms.float32)
        for batch in micro_batches[:-1]:  # (input_ids, labels[, segment_ids]) numpy arrays
            self.accumulating(tokens, *map(Tensor, batch))
        out = self.final(Tensor(lr, ms.float32), tokens, Tensor(float(stop_requested), ms.float32),
                         *map(Tensor, micro_batches[-1]))
        loss_sum, token_total, norm, overflow, scale, stops = (float(v) for v in out.asnumpy())
        token_total = int(round(token_total))
        return StepResult(loss_sum / max(token_total, 1), token_total, norm, overflow > 0, scale, stops > 0, lr)

    def loss_scale_state(self) -> dict:
        return self.scaler.state(self.final)

    def load_loss_scale_state(self, state: dict) -> None:
        self.scaler.load_state(self.final, state)
