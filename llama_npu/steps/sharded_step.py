"""The train step of the sharded layouts (model / pipeline parallel, optimizer sharding):
MindFormers' own wrapper chain under semi_auto_parallel, one graph per step.

Assembled the way mindformers/trainer/base_trainer.py does it (training_process ->
_wrap_network_with_tool_cells_legacy -> create_model_wrapper, with _reset_wrapper_*):

    the loss network: MindFormers' LlamaForCausalLM in training mode, with
        calculate_per_token_loss, returns (summed token loss, target tokens)
        (train.objective dpo: (summed pair losses, pairs), objectives/dpo/sharded.py)
    -> GradAccumulationCellWithTwoOutput(k)        when k > 1 micro-batches, no pipeline
       PipelineCellWithTwoOutput(micro_batches)     when pipelining
    -> _VirtualDatasetCell                          (the full batch, split by data parallel)
    -> MFTrainOneStepCell                           k = 1, no pipeline
       MFPipelineWithLossScaleCell(micro_batch_num) otherwise (base_trainer switches to it
                                                    for accumulation and for pipelines)
       each as clearing_before_forward(...), which clears the float-status registers first

Per-token normalisation: our unsharded loss cell returns a summed token loss and the
step divides by the step's target tokens. Here MindFormers does the same division itself:
with calculate_per_token_loss its CrossEntropyLoss returns (numerator, denominator), the
accumulation and pipeline cells add both over the micro-batches, and the wrapper
divides the loss and the gradients by the (all-reduced) denominator
(mindformers/wrapper/wrapper.py, grads_for_legacy). So the loss and gradients are means
over every target token of the step, as in TrainStep.

Nothing here runs on the CPU backend ("Invalid communication backend: CPU for
semi_auto_parallel"); CI checks the chain these functions build (tests/test_parallel.py,
under msrun, because MindFormers' pipeline wrapper creates a communication group).
"""
from __future__ import annotations

import math

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn, ops
from mindspore.communication.comm_func import all_reduce
from mindspore.nn.wrap.cell_wrapper import _VirtualDatasetCell
from mindspore.ops import ReduceOp
from mindspore.ops import operations as P
from mindspore.ops.operations.math_ops import NPUClearFloatStatusV2

from ..common.console import note
from ..model.loss import layers_with_additive_mask
from ..model.tokens import IGNORE_ID
from ..objectives.sft import target_tokens
from ..recipe.schema import Recipe
from ..strategies.parallel import ParallelSection, World
from .contract import Step, StepResult
from .graph_step import REGISTERS, overflow_check

_clear_float_status = NPUClearFloatStatusV2()


class TrainLoss(nn.Cell):
    """(input_ids, labels[, segment_ids]) -> (summed token loss, target tokens), computed by
    MindFormers' LlamaForCausalLM (built with calculate_per_token_loss), whose own slicing,
    masking, LM head and CrossEntropyLoss carry MindFormers' shard strategies
    (mindformers/models/llama/llama.py). Ours is only the block-causal mask of packed rows,
    with the data-parallel strategies llama.py gives its own mask ops."""

    def __init__(self, llama, data_parallel: int, seq_length: int):
        super().__init__(auto_prefix=False)  # keep MindFormers' parameter names
        self.llama = llama
        self.flash_attention = llama.config.use_flash_attention
        dp = data_parallel
        self.causal = Tensor(np.tril(np.ones((1, seq_length, seq_length), np.bool_)))
        self.slice = P.StridedSlice().shard(((dp, 1),))
        self.reshape = P.Reshape()
        self.equal = P.Equal().shard(((dp, 1, 1), (dp, 1, 1)))
        self.logical_and = P.LogicalAnd().shard(((dp, 1, 1), (1, 1, 1)))
        self.logical_not = P.LogicalNot().shard(((dp, 1, 1),))
        self.cast = P.Cast()
        # The additive path (no flash attention): its mask and the training branch of
        # LlamaForCausalLM.construct after the layers, with llama.py's strategies.
        self.to_additive = P.Mul().shard(((dp, 1, 1), ()))
        self.not_equal = P.NotEqual().shard(((dp, 1), ()))
        self.mul = P.Mul().shard(((dp, 1), (dp, 1)))

    def construct(self, input_ids, labels, segment_ids=None):
        if segment_ids is None:
            return self.llama(input_ids, labels)
        bs, length = input_ids.shape
        t = length - 1
        segments = self.slice(segment_ids, (0, 0), (bs, t), (1, 1))  # (B, T), as llama slices tokens
        same = self.equal(self.reshape(segments, (bs, t, 1)), self.reshape(segments, (bs, 1, t)))
        blocked = self.logical_not(self.logical_and(same, self.causal))  # (B, T, T), True = masked
        if self.flash_attention:
            # Flash attention honours a passed uint8 mask, 1 = masked (910B and later).
            mask = self.reshape(self.cast(blocked, ms.uint8), (bs, 1, t, t))
            return self.llama(input_ids, labels, None, None, mask)
        # No flash attention (the 910A): LlamaModel would turn any passed mask into a uint8
        # that the plain attention adds to its scores (loss.layers_with_additive_mask).
        tokens = self.slice(input_ids, (0, 0), (bs, t), (1, 1))
        targets = self.slice(labels, (0, 1), (bs, length), (1, 1))
        mask = self.reshape(self.to_additive(self.cast(blocked, ms.float32), -10000.0), (bs, 1, t, t))
        logits = self.llama.lm_head(layers_with_additive_mask(self.llama.model, tokens, mask))
        weights = self.mul(self.cast(self.not_equal(tokens, self.llama.pad_token_id), ms.float32),
                           self.cast(self.not_equal(targets, IGNORE_ID), ms.float32))
        logits = self.cast(self.reshape(logits, (-1, logits.shape[-1])), ms.float32)
        return self.llama.loss(logits, self.reshape(targets, (-1,)), self.reshape(weights, (-1,)))


class EvalLoss(nn.Cell):
    """(input_ids, labels) -> summed token loss, for evaluation under semi-auto parallel.
    MindFormers' Llama returns logits, not a loss, outside training mode, so this repeats
    the training branch of LlamaForCausalLM.construct with the same shard strategies
    (slice, not_equal and mul on (dp, 1)) and MindFormers' own sharded CrossEntropyLoss."""

    def __init__(self, llama, data_parallel: int):
        super().__init__(auto_prefix=False)
        self.llama = llama
        dp = data_parallel
        self.slice = P.StridedSlice().shard(((dp, 1),))
        self.not_equal = P.NotEqual().shard(((dp, 1), ()))
        self.mul = P.Mul().shard(((dp, 1), (dp, 1)))
        self.reshape = P.Reshape()
        self.cast = P.Cast()

    def construct(self, input_ids, labels):
        bs, length = input_ids.shape
        tokens = self.slice(input_ids, (0, 0), (bs, length - 1), (1, 1))
        targets = self.slice(labels, (0, 1), (bs, length), (1, 1))
        logits, _, input_mask = self.llama(tokens)
        mask = self.mul(input_mask, self.cast(self.not_equal(targets, IGNORE_ID), ms.float32))
        numerator, _ = self.llama.loss(self.reshape(logits, (-1, logits.shape[-1])),
                                       self.reshape(targets, (-1,)), self.reshape(mask, (-1,)))
        return numerator


class EvalKeepingTrainStrategy:
    """The eval network, called as evaluate() calls a loss cell. MindSpore saves the
    strategy file for every semi-auto graph it compiles while strategy_ckpt_save_file is
    set (CheckpointStrategy, mindspore/ccsrc/frontend/parallel/step_parallel.cc), so the eval
    graph, compiled after the train graph, would replace the train graph's layouts (its
    optimizer-shard information included) with its own; saving is switched off before it
    compiles. Graph caching ignores that setting: the train graph is not recompiled."""

    def __init__(self, network):
        self.network = network

    def set_train(self, mode: bool = True):
        self.network.set_train(mode)
        return self

    def __call__(self, *inputs):
        ms.set_auto_parallel_context(strategy_ckpt_config={"save_file": ""})
        return self.network(*inputs)


def eval_network(llama, data_parallel: int) -> EvalKeepingTrainStrategy:
    """As base_trainer.wrap_eval_network_with_tool_cells: _VirtualDatasetCell around it."""
    return EvalKeepingTrainStrategy(_VirtualDatasetCell(EvalLoss(llama, data_parallel)))


def build_train_network(llama, optimizer, recipe: Recipe, scale_sense, k: int, network=None) -> nn.Cell:
    """The one train graph, as base_trainer.training_process assembles it. Needs the
    semi-auto parallel context set (and, for the pipeline wrapper, communication).
    `scale_sense`: LossScaler.sense(), the update cell MindFormers' configs name for dynamic
    scaling (mindspore.nn.DynamicLossScaleUpdateCell) or a fixed value. `k`: the recipe's
    accumulation steps. `network`: the loss network returning (numerator, denominator);
    TrainLoss by default, DPO's pair loss (objectives/dpo/sharded.py)."""
    # imported here: MindFormers loads through mute_mindformers_info (common/frameworks.py), stdout captured
    from mindformers.wrapper.wrapper import (GradAccumulationCellWithTwoOutput, MFPipelineWithLossScaleCell,
                                             MFTrainOneStepCell, PipelineCellWithTwoOutput)

    par, clip = recipe.strategies.parallel, recipe.train.grad_clip
    network = network or TrainLoss(llama, par.data, recipe.data.max_seq_len)
    # _wrap_network_with_tool_cells_legacy: with calculate_per_token_loss MindFormers picks
    # the two-output variants of GradAccumulationCell and PipelineCell.
    if par.pipeline > 1:
        network, micro_batch_num = PipelineCellWithTwoOutput(network, micro_size=par.micro_batches), par.micro_batches
    elif k > 1:
        network, micro_batch_num = GradAccumulationCellWithTwoOutput(network, k), k
    else:
        micro_batch_num = 1
    network = _VirtualDatasetCell(network)
    common = {"use_clip_grad": clip > 0, "max_grad_norm": clip or 1.0,
              "scale_sense": scale_sense, "calculate_per_token_loss": True}
    # _reset_wrapper_for_pipeline_parallel / _reset_wrapper_for_grad_accu: the pipeline
    # wrapper for either, with micro_batch_num = the pipeline's micro-batches or k.
    if micro_batch_num > 1:
        wrapper = clearing_before_forward(MFPipelineWithLossScaleCell)(network, optimizer,
                                                                       micro_batch_num=micro_batch_num, **common)
    else:
        wrapper = clearing_before_forward(MFTrainOneStepCell)(network, optimizer, **common)
    return wrapper


def clearing_before_forward(one_step_cell: type) -> type:
    """One of MindFormers' wrappers (mindformers/wrapper/wrapper.py) with the float-status order
    of step.MicroStep (clear_registers_before says why): the registers cleared at the start,
    before the forward reads the batch, and read then cleared by get_overflow_status after the
    gradients' all-reduce (mindspore/nn/wrap/loss_scale.py
    _get_ascend_overflow_status_on_saturation_mode).
    - MFTrainOneStepCell (k = 1) calls start_overflow_check after the forward and the backward,
      with nothing ordering that clear before the backward (wrapper.py line 322), so it could
      erase a backward overflow, and a saturation in the forward was cleared with it. Here
      start_overflow_check clears nothing, as MindSpore 2.9.0's own
      TrainOneStepWithLossScaleCell.construct calls none.
    - MFPipelineWithLossScaleCell (k > 1, pipelines) calls no clear before its read at all
      (its construct passes a constant status to get_overflow_status), so what ran since the
      last step's read (that step's update, an evaluation) was charged to this step.
    The override keeps the wrapper's construct flags (the pipeline one has has_effect)."""

    class ClearingBeforeForward(one_step_cell):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.registers = overflow_check(self) == REGISTERS

        def start_overflow_check(self, pre_cond, compute_input):
            return Tensor([0] * 8, ms.int32), compute_input

        @ops.add_flags(**getattr(one_step_cell.construct, "_func_graph_flags", {}))
        def construct(self, *inputs):
            if self.registers:
                cleared = _clear_float_status(Tensor([0] * 8, ms.int32))
                inputs = (ops.depend(inputs[0], cleared),) + inputs[1:]
            return super().construct(*inputs)

    return ClearingBeforeForward


def step_inputs(micro_batches, arrange=None) -> list:
    """The graph's inputs: each array of the k micro-batches (each first put in the order
    `arrange` gives), concatenated along the batch axis, which MindFormers' accumulation cell
    cuts back into k."""
    if arrange is not None:
        micro_batches = [arrange(batch) for batch in micro_batches]
    return [Tensor(np.concatenate(parts)) for parts in zip(*micro_batches)]


class ShardedStep(Step):
    """One optimizer step of a sharded layout, with TrainStep's interface: the k
    micro-batches of the step go into the graph as one batch, which MindFormers' accumulation
    or pipeline cell cuts back into k (or micro_batches) pieces."""

    def __init__(self, llama, optimizer, scaler, recipe: Recipe, k: int, network=None, count=target_tokens,
                 arrange=None):
        """`network`, `count`, `arrange`: the loss network (build_train_network), what its
        denominator counts in a micro-batch (target tokens; DPO's pairs) and the row order a
        micro-batch goes in with (DPO: objectives/dpo/sharded.py interleave)."""
        # The wrappers call the optimizer only inside `if not overflow`, where a host-side
        # set_data of a learning-rate Parameter is not seen by the compiled graph (MindSpore
        # 2.9.0, checked on CPU): the schedule must be a cell the optimizer evaluates itself.
        if not optimizer.dynamic_lr:
            raise ValueError("ShardedStep needs an optimizer from build_optimizer(..., schedule_in_graph=True)")
        self.train_network = build_train_network(llama, optimizer, recipe, scaler.sense(), k, network)
        self.train_network.set_train(True)
        self.network, self.optimizer, self.scaler = llama, optimizer, scaler
        self.count, self.arrange = count, arrange

    def _inputs(self, micro_batches):
        return step_inputs(micro_batches, self.arrange)

    def compile(self, micro_batches) -> None:
        """Compile the train graph, which slices every Parameter to this rank's shard
        (mindspore/parallel/_utils.py): what Model.build does (mindspore/train/model.py,
        train_network.compile(*inputs)) and MindFormers runs before loading a checkpoint
        (mindformers/checkpoint/utils.py compile_model)."""
        self.train_network.compile(*self._inputs(micro_batches))

    def compile_before_load(self, example_batches) -> None:
        note("compiling the train graph before loading the checkpoint, so parameters have their sharded shapes")
        self.compile(example_batches())

    def __call__(self, micro_batches, lr: float, stop_requested: bool = False) -> StepResult:
        """`lr`, the loop's lr_at(step), is not used: the optimizer's schedule cell gives
        lr_at(updates applied so far + 1), so each step skipped for overflow puts the sharded
        schedule one more step behind the loop's step number, as in MindFormers' training.
        The result carries the rate the graph computed for this step (MindFormers' wrappers
        return it, applied or, on overflow, skipped), which is what metrics.jsonl logs."""
        tokens = sum(self.count(batch) for batch in micro_batches)
        # The scale this step uses; the wrapper updates it on the device (loss_scaling_manager).
        scale = float(self.train_network.scale_sense.asnumpy())
        loss, overflow, _, step_lr, global_norm = self.train_network(*self._inputs(micro_batches))
        # With a pipeline only the last stage computes the loss (MindSpore broadcasts it to
        # the other stages only with pipeline_result_broadcast, off by default), and a stop
        # request must reach every rank: one MAX over all ranks settles both.
        agreed, _ = all_reduce(Tensor([loss.asnumpy().item(), float(stop_requested)], ms.float32), ReduceOp.MAX)
        loss, stops = (float(v) for v in agreed.asnumpy())
        overflow = bool(overflow.asnumpy().item()) or not math.isfinite(loss)
        # Without clipping (train.grad_clip 0) MindFormers' wrappers compute no norm.
        grad_norm = global_norm.asnumpy().item() if global_norm is not None else float("nan")
        return StepResult(loss, tokens, grad_norm, overflow, scale, stops > 0, float(step_lr.asnumpy()))

    # The checkpoint sidecar's {scale, clean_steps}, read from and restored into the
    # wrapper's own scale_sense and DynamicLossScaleUpdateCell, as for TrainStep.
    def loss_scale_state(self) -> dict:
        return self.scaler.state(self.train_network)

    def load_loss_scale_state(self, state: dict) -> None:
        self.scaler.load_state(self.train_network, state)


def eval_layout(net, loss_cell, section: ParallelSection, world: World, micro_batch_size: int):
    """(cell, batch size) for evaluation during training. Semi-auto parallel: MindFormers'
    loss wrapped in _VirtualDatasetCell (base_trainer.wrap_eval_network_with_tool_cells),
    fed the whole data-parallel batch, which divides by the data-parallel degree by
    construction. Pipelines do not evaluate (recipe validation refuses it)."""
    if not world.sharded:
        return loss_cell, micro_batch_size
    return eval_network(net, section.data), micro_batch_size * section.data
