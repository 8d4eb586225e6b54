"""train.objective dpo on the sharded layout it supports: data parallel with optimizer_shard
(section.py refuses model and pipeline parallel), through MindFormers' wrapper
chain (steps/sharded_step.py) under semi_auto_parallel. Ascend only: CI builds the chain
under msrun (tests/sharded_chain.py) and checks the loss network on the CPU, stand-alone.

How pairs land. Every rank reads the same global batch (full_batch): the k micro-batches of
the step concatenated, each of P x dp pairs. Two cuts split its rows, both into contiguous
blocks along the batch axis: MindFormers' accumulation cell cuts k micro-batches
(mindspore/nn/wrap/cell_wrapper.py _MicroBatch: rows [i B/k, (i+1) B/k)), and
_VirtualDatasetCell's data-parallel strategy gives card c the c-th of dp blocks. In TRL's
concatenated order (all chosen rows, then all rejected) a pair's chosen row would land in the
first half of the batch and its rejected row in the second, on another card. So the step
interleaves them: pair j's chosen row is row 2j, its rejected row 2j + 1 (`interleave`, the
reference log-probs with them). Every block either cut makes has an even length and starts at
an even row, so a pair's two rows stay on one card in one micro-batch whichever cut comes
first, and the card scores its pairs alone (loss.py InterleavedPairs).

The division. MindFormers' wrappers with calculate_per_token_loss take (numerator,
denominator) from the network, add both over the micro-batches and divide the loss and the
gradients by the denominator (mindformers/wrapper/wrapper.py grads_for_legacy; with
optimizer_shard the k > 1 wrapper divides the sharded gradients by it too,
tensor_shard_grad_scale_pipeline). Here the numerator is the micro-batch's summed pair losses
and the denominator its pairs, so the step's loss and gradients are means over the step's
pairs, as TrainStep divides PreferenceLoss's sum by pairs_of. Both are sums over the global
batch (semi-auto parallel inserts the all-reduce of a sum over the split batch axis), as
MindFormers' own loss returns its global target-token count.

The metrics: PreferenceLoss adds the global sums of its pairs' rewards and log-probs into its
metric Parameter, so the host divides by the pairs of every card (take_metrics).

The reference (dpo.reference precomputed): the pass before step 1 runs unsharded on each
card, over every pair, in a stand-alone context (common/collective.py stand_alone): a forward needs no optimizer
states, and the weights are whole until the train graph compiles (the planner counts the pass
below the step's forward phase, memory/planner.py strategy_from_recipe). Each card computes
the same values from the same starting weights; rank 0 stores them. Left as in data parallel:
the pass is not divided among the cards.
"""
from __future__ import annotations

from contextlib import nullcontext

import numpy as np

import mindspore as ms
from mindspore import nn, ops

from ...common.collective import stand_alone
from ...strategies.parallel import World


def interleave(batch):
    """A micro-batch of P pairs in TRL's order ((2P, T+1) ids and labels, (2P,) reference:
    P chosen rows, then P rejected) -> the same arrays with pair j's rows at 2j and 2j + 1."""
    pairs = batch[0].shape[0] // 2
    order = np.stack([np.arange(pairs), np.arange(pairs) + pairs], axis=1).reshape(-1)
    return tuple(array[order] for array in batch)


class PairLossTwoOutputs(nn.Cell):
    """(input_ids, labels, reference) in the interleaved order -> (summed pair losses, pairs):
    the (numerator, denominator) MindFormers' two-output chain takes (module docstring)."""

    def __init__(self, loss_cell):
        super().__init__(auto_prefix=False)
        self.network = loss_cell  # a PreferenceLoss built with data_parallel (InterleavedPairs)

    def construct(self, input_ids, labels, reference):
        pairs = ops.scalar_to_tensor(input_ids.shape[0] // 2, ms.float32)
        return self.network(input_ids, labels, reference), pairs


def reference_context(world: World):
    """Where the reference pass compiles: stand-alone on each card of a sharded run."""
    return stand_alone() if world.sharded else nullcontext()
