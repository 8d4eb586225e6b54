"""What train.objective dpo gives a run's session (objectives/parts.py): the loss cell is the
pairs' (loss.py), a step's loss is a mean over its pairs, the metrics are TRL's, and under
dpo.reference precomputed the pairs carry the starting weights' log-probs
(objectives/reference_pass.py); under adapters_off the loss cell computes them in the step
(objectives/adapters_off.py). The sharded layout: sharded.py."""
from __future__ import annotations

from functools import partial
from pathlib import Path

from ...strategies.accumulation import accumulation_steps
from ...strategies.parallel import World
from ..parts import ObjectiveParts
from ..reference_pass import precomputed_reference
from .loss import PreferenceLoss
from .sharded import PairLossTwoOutputs, interleave, reference_context
from .source import PairSource


def pairs_of(batch) -> int:
    """A preference micro-batch's pairs: its 2P rows are P chosen, then P rejected."""
    return batch[0].shape[0] // 2


def preference_parts(recipe, run_dir: Path, net, source: PairSource, world: World) -> ObjectiveParts:
    """The DPO loss cell and its step's parts; fills `source`'s reference under
    dpo.reference precomputed (a pass over every training pair, or the run directory's stored
    one, checked; rank 0 stores it). A sharded `world` runs the pass stand-alone and gets the
    loss of interleaved pairs (sharded.py)."""
    chunked, parallel = recipe.strategies.chunked_ce, recipe.strategies.parallel
    chunk_size = chunked.chunk_size if chunked.enabled else None
    if recipe.dpo.reference == "precomputed":
        with reference_context(world):
            source.reference = precomputed_reference(run_dir, net, chunk_size, source.pairs,
                                                     recipe.train.micro_batch_size, recipe.data.max_seq_len + 1,
                                                     world.is_main)
    loss_cell = PreferenceLoss(net, recipe.dpo, chunk_size, parallel.data if world.sharded else None)
    loss_cell.set_train(True)
    # Sharded: the metric sums are over every card's pairs (sharded.py).
    pairs = recipe.train.micro_batch_size * accumulation_steps(recipe) * (parallel.data if world.sharded else 1)
    # the pair loss in MindFormers' chain, fed interleaved pairs
    sharded = {"network": PairLossTwoOutputs(loss_cell), "count": pairs_of, "arrange": interleave} \
        if world.sharded else None
    return ObjectiveParts(loss_cell, pairs_of, partial(loss_cell.take_metrics, pairs), sharded=sharded)
