"""The optimizer on the host (ZeRO-Offload style): with `optimizer: host` the card keeps only
the weights in the compute dtype (the RMSNorm gains stay fp32), one micro-batch's gradients
and the activations; the fp32 master weights, the AdamW moments and the fp32 gradient
accumulators live in host memory, and the update runs there on `threads` cores
(training/host_step.py, training/host_optimizer.py: the step and the update's formula).

The training is the one the same recipe runs without it: overflow is still detected on the
card, and unscaling, clipping, the schedule, decay on matrices only and token-normalised
accumulation are unchanged; the checkpoint holds the fp32 master and the moments under the
in-graph optimizer's names, so a run resumes across the switch.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from ..common.launcher import launched_workers
from ..model.architecture import matched_layers, resolve_shape
from ..recipe.problems import RecipeError, choice
from .lora import lora_params_per_layer

KEY = "offload"
CHECKED_AFTER = ("model", "lora", "parallel")  # it refuses some of their settings
OPTIMIZERS = ("device", "host")
MAX_THREADS = 1024  # more cores than any host we know of has: a typo, not a machine
# fp32 weight, gradient and AdamW's two moments: what a trainable parameter costs the card in-graph.
ADAPTER_STATE_BYTES = 16


@dataclass
class OffloadSection:
    optimizer: str = "device"  # device | host: where the fp32 master, the moments and the update live
    threads: Optional[int] = None  # the host update's threads; null: the cores of this rank's share of the node


SECTION = OffloadSection


def check(recipe) -> None:
    section = recipe.strategies.offload
    choice("strategies.offload.optimizer", section.optimizer, OPTIMIZERS)
    if section.threads is not None and not (isinstance(section.threads, int) and 1 <= section.threads <= MAX_THREADS):
        raise RecipeError(f"strategies.offload.threads: expected null (this rank's share of the node's cores) or "
                          f"1 to {MAX_THREADS}, got {section.threads!r}")
    if section.optimizer != "host":
        return
    if recipe.train.optimizer.name != "adamw":
        raise RecipeError(f"strategies.offload.optimizer=host with train.optimizer.name={recipe.train.optimizer.name}: "
                          f"the host runs AdamW only (SGD keeps no states worth moving); use adamw or "
                          f"offload.optimizer device")
    lora = recipe.strategies.lora
    if lora.enabled:
        shape = resolve_shape(recipe.model)
        adapters = shape.num_layers * lora_params_per_layer(shape, lora.rank, matched_layers(lora.target_modules))
        raise RecipeError(f"strategies.offload.optimizer=host with strategies.lora.enabled=true: the adapters' "
                          f"fp32 weights, gradients and moments take {adapters * ADAPTER_STATE_BYTES / 2**20:.1f} MiB "
                          f"on the card, so moving them to the host buys nothing; use offload.optimizer device")
    par = recipe.strategies.parallel
    sharded = [f"{k}={v}" for k, v in (("model", par.model), ("pipeline", par.pipeline)) if v > 1]
    sharded += ["optimizer_shard=true"] if par.optimizer_shard else []
    if sharded or par.data > 1:
        layout = sharded[0] if sharded else f"data={par.data}"
        raise RecipeError(f"strategies.offload.optimizer=host with strategies.parallel.{layout}: the host update "
                          f"runs in one process on one card (no layout over several ranks is supported yet); "
                          f"train on one card, or use offload.optimizer device")


def host_threads(section: OffloadSection) -> int:
    """The update's threads: the recipe's, or this rank's share of the cores it may run on
    (LOCAL_WORKERS, as scripts/launch.sh takes it, else every launched worker is on this node)."""
    if section.threads:
        return section.threads
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    local = int(os.environ.get("LOCAL_WORKERS") or launched_workers())
    return max(1, cores // max(local, 1))


def on_host(recipe) -> bool:
    return recipe.strategies.offload.optimizer == "host"


def rehearse(r) -> None:
    """Offload rehearses as set, on at most this machine's cores."""
    section = r.recipe.strategies.offload
    if section.optimizer != "host":
        return
    if section.threads and section.threads > (os.cpu_count() or 1):
        r.change("strategies.offload.threads", None, "this machine's cores")
    r.not_rehearsed.append("the card-host transfers: on the CPU the card's memory is the host's")


# ---------------------------------------------------------------- planner term
# (offload-plan adds the planner's terms here; until then the planner sees no offload keys.)

def plan_settings(recipe) -> dict:
    return {}
