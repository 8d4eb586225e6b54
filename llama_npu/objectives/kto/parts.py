"""What train.objective kto gives a run's session (objectives/parts.py): the loss cell
(loss.py), a step's loss as a mean over its replies, TRL's metrics, the KL estimate of the
step put into its micro-batches before it (kl_estimate.py), and the reference: precomputed
before step 1 (reference.py) or the LoRA policy with its adapters off, in the graphs
(objectives/adapters_off.py)."""
from __future__ import annotations

from pathlib import Path

from ...strategies.parallel import World
from ..parts import ObjectiveParts
from .kl_estimate import KlEstimate
from .loss import KlLogRatios, KtoLoss, adapter_switch
from .reference import fill_reference
from .replies import KtoSource


def replies_of(batch) -> int:
    """What a KTO micro-batch's summed loss is over: its replies, one a row."""
    return batch[0].shape[0]


def kto_parts(recipe, run_dir: Path, net, source: KtoSource, world: World) -> ObjectiveParts:
    """The KTO loss cell and its step's parts; under kto.reference precomputed fills `source`'s
    reference and the KL rows' (a pass before step 1, or the run directory's stored one,
    checked; rank 0 stores it)."""
    chunked, section = recipe.strategies.chunked_ce, recipe.kto
    chunk_size = chunked.chunk_size if chunked.enabled else None
    kl_reference = None
    if section.reference == "precomputed":  # before a resume loads trained weights: the reference's are the start's
        kl_reference = fill_reference(recipe, run_dir, net, chunk_size, source, world.size, world.is_main)
    switch = adapter_switch(net, section)
    loss_cell = KtoLoss(net, section, chunk_size, switch)
    loss_cell.set_train(True)
    estimate = KlEstimate(KlLogRatios(net, chunk_size, switch), kl_reference, world.size)
    return ObjectiveParts(loss_cell, replies_of, lambda: loss_cell.take_metrics(estimate.kl), prepare=estimate)
