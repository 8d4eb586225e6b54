"""What train.objective dpo changes in a run's set-up (training/session.py): the loss cell is
the preference objective's (objectives/preference_loss.py), a step's loss is a mean over its
pairs, and under dpo.reference precomputed the pairs carry the starting weights' log-probs
(training/reference_pass.py); under adapters_off the loss cell computes them in the step
(objectives/adapters_off.py)."""
from __future__ import annotations

from pathlib import Path

from ..data.pair_source import PairSource
from ..objectives.preference_loss import PreferenceLoss
from ..strategies.parallel import World
from .reference_pass import precomputed_reference
from .sharded_preference import reference_context


def pairs_of(batch) -> int:
    """A preference micro-batch's pairs: its 2P rows are P chosen, then P rejected."""
    return batch[0].shape[0] // 2


def preference_parts(recipe, run_dir: Path, net, source: PairSource, world: World) -> PreferenceLoss:
    """The DPO loss cell; fills `source`'s reference under dpo.reference precomputed (a pass
    over every training pair, or the run directory's stored one, checked; rank 0 stores it).
    A sharded `world` runs the pass stand-alone and gets the loss of interleaved pairs
    (training/sharded_preference.py)."""
    chunked, parallel = recipe.strategies.chunked_ce, recipe.strategies.parallel
    chunk_size = chunked.chunk_size if chunked.enabled else None
    if recipe.dpo.reference == "precomputed":
        with reference_context(world):
            source.reference = precomputed_reference(run_dir, net, chunk_size, source.pairs,
                                                     recipe.train.micro_batch_size, recipe.data.max_seq_len + 1,
                                                     world.is_main)
    loss_cell = PreferenceLoss(net, recipe.dpo, chunk_size, parallel.data if world.sharded else None)
    loss_cell.set_train(True)
    return loss_cell
