"""The optimizer on the host (ZeRO-Offload style): with `optimizer: host` the card keeps only
the weights in the compute dtype (the RMSNorm gains stay fp32), one micro-batch's gradients
and the activations; the fp32 master weights, the AdamW moments and the fp32 gradient
accumulators live in host memory, and the update runs there on `threads` cores
(steps/host/step.py, steps/host/optimizer.py: the step and the update's formula).

The training is the one the same recipe runs without it: overflow is still detected on the
card, and unscaling, clipping, the schedule, decay on matrices only and token-normalised
accumulation are unchanged; the checkpoint holds the fp32 master and the moments under the
in-graph optimizer's names, so a run resumes across the switch. Under data parallel each
rank's host holds and updates 1/N of the states (steps/host/shards.py); model, pipeline
and optimizer sharding are refused.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from ..common.launcher import local_workers
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
    if sharded:
        raise RecipeError(f"strategies.offload.optimizer=host with strategies.parallel.{sharded[0]}: the host "
                          f"update runs on whole weights, one card or data parallel (no sharded layout is "
                          f"supported yet); use data parallel, or offload.optimizer device")


def host_threads(section: OffloadSection) -> int:
    """The update's threads: the recipe's, or this rank's share of the cores it may run on
    (LOCAL_WORKERS, as scripts/launch.sh takes it, else every launched worker is on this node)."""
    if section.threads:
        return section.threads
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    local = local_workers()
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
# What the planner counts with `optimizer: host` (memory/planner.py calls these): on the card,
# the weights in the compute dtype and one micro-batch's gradients in it, and no optimizer
# states or update copies; on the host, the rank's shard of the fp32 master weights, the two
# AdamW moments, the fp32 gradient accumulators and one tensor in flight each way.

# Bytes a parameter the host update reads and writes: it reads the fp32 master, both moments
# and the fp32 gradient (16) and writes the master and moments back (12); the compute-dtype
# copy for the card is a further 2, left out as ZeRO-Offload's count leaves it.
UPDATE_BYTES_PER_PARAMETER = 28
# A rank's share of the host's memory bandwidth, 10^9 bytes/s, when `plan --host-bandwidth`
# does not state it: what a two-thread streaming add reached on a 2-core x86_64 host (21.6,
# FACTS.md); benchmarks/host_optimizer.py measures a host's own.
DEFAULT_HOST_BANDWIDTH = 20.0
# One direction of a PCIe 4.0 x16 link as a copy reaches it, 10^9 bytes/s (32 nominal);
# `selftest` measures a card's own (host_optimizer).
PCIE_BANDWIDTH = 25.0
# The ranks a node's host memory serves when the layout spans them: an Atlas 800 holds 8 cards.
CARDS_PER_NODE = 8


def plan_settings(recipe) -> dict:
    return {"offload": on_host(recipe)}


def planned_on_host(s) -> bool:
    """Whether the planner's Strategy `s` has the optimizer's states and update on the host."""
    return s.offload


def planned_layout_supported(data: int, model: int, pipeline: int, optimizer_shard: bool) -> bool:
    """The layouts check() lets the host update run on: one card, or data parallel."""
    return model == pipeline == 1 and not optimizer_shard


def card_states(on_device: int, norms: int, compute_bytes: int) -> dict:
    """The model states the card holds: the weights and one micro-batch's gradients, in the
    compute dtype but for the `norms` RMSNorm gains, kept fp32; the gradients leave for the
    host's accumulators after each backward, so none are kept across micro-batches, and no
    optimizer state is on the card."""
    half = (on_device - norms) * compute_bytes + norms * 4
    return {"weights": half, "weight_compute_copies": 0, "gradients": half, "micro_batch_gradients": 0,
            "optimizer_states": 0}


def host_shard(trainable: int, s) -> int:
    """Parameters one rank's host update owns: 1/N under data parallel (of the matrices; every
    rank also keeps the RMSNorm gains whole, about 0.01% of a Llama, not counted)."""
    return -(-trainable // s.data)


def exchange_bytes(card_weights: int, s) -> int:
    """The card's update-phase copy under data parallel: the ranks' updated ranges gathered into
    the whole weights before each matrix takes its slice (steps/host/shards.py CardExchange),
    when no activation or gradient is alive."""
    return card_weights if s.data > 1 else 0


def host_states(trainable: int, s, largest: int, compute_bytes: int) -> dict:
    """Host bytes one rank holds: its shard's fp32 master weights and AdamW's two fp32 moments;
    the fp32 gradient accumulators, at k = 1 too, where they are the fp32 gradients the fused
    kernel reads (steps/host/optimizer.py adds each micro-batch into them); and `staging`,
    one tensor of `largest` elements in the compute dtype in flight, a gradient read off the
    card or a master cast for it, one tensor at a time (HostAdamW.accumulate and push), or
    under data parallel the rank's range sent to the card, fp32 and cast, if larger."""
    shard = host_shard(trainable, s)
    # Under data parallel the rank's range goes to the card at once, fp32 and cast (HostAdamW.push).
    in_flight = max(largest * compute_bytes, (4 + compute_bytes) * shard if s.data > 1 else 0)
    return {"master_weights": 4 * shard, "moments": 8 * shard, "accumulators": 4 * shard, "staging": in_flight}


def ranks_per_node(s) -> int:
    return min(s.devices, CARDS_PER_NODE)


def update_seconds(trainable: int, s, bandwidth_gbs: float) -> float:
    """The host update's time a step: memory-bound, UPDATE_BYTES_PER_PARAMETER over the shard
    at the rank's share of the host's bandwidth."""
    return host_shard(trainable, s) * UPDATE_BYTES_PER_PARAMETER / (bandwidth_gbs * 1e9)


def transfer_bytes(trainable: int, s, compute_bytes: int) -> dict:
    """Bytes a step moves between one card and its host: each micro-batch's gradients of the
    rank's shard to the host (the card all-reduced them), and the updated shard's
    compute-dtype weights back once (the card gathers the other ranks' from their cards)."""
    shard = host_shard(trainable, s)
    return {"to_host": s.accumulation * compute_bytes * shard, "to_device": compute_bytes * shard}


def host_passes(s, compute_bytes: int) -> dict:
    """The host's passes over its shard, bytes a parameter each (read + written), as
    steps/host/step.py and host_optimizer.py run them: per micro-batch (HostAdamW.accumulate)
    the card's gradient in the compute dtype read and the fp32 accumulator read and written;
    per step (square_sum, step, push) the norm's read, the unscale's read and write, the fused
    AdamW update, the zeroing's write and the master's cast for the card (fp32 read, the
    compute dtype written; under data parallel first gathered into one range, read and
    written). Lower bounds: a temporary the libraries make adds to them."""
    push = {"cast for the card": 4 + compute_bytes}
    if s.data > 1:
        push["gather the range (torch.cat)"] = 8
    return {"accumulate": {"read the gradient": compute_bytes, "read the accumulator": 4, "write it": 4},
            "step_end": {"norm (sum of squares)": 4, "unscale and clip": 8,
                         "AdamW update": UPDATE_BYTES_PER_PARAMETER, "zeroing": 4},
            "push": push}
