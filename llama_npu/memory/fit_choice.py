"""Which plan `plan --fit` recommends among those the search (planner.fit) finds to fit.

- A layout run on an NPU beats one never run there (everything operator-sharded), whatever
  else either gains: a sharded layout is only as good as the pattern it follows.
- Then the recipe's choice of full fine-tuning or LoRA, then of where the optimizer runs: a
  full fine-tune that fits no card keeps training every weight with the optimizer on the host
  (strategies.offload) before it is sent to LoRA; the host's update costs time a step.
- Then, by what --maximize asks for: the fewest changed settings (no --maximize: a plan that
  does not fit, or a layout --devices breaks, is repaired, not redesigned), the largest
  micro-batch, the longest sequence, or the shortest predicted step a token
  (memory/step_time.py speed_key; with the optimizer on the host, fewer micro-batches at the
  same global batch make fewer host passes).
- The global batch is kept; it changes only when no micro-batch of any tested layout divides
  it on the devices given (e.g. a global batch of 16 on 32 data-parallel devices).
"""
from __future__ import annotations

from dataclasses import fields, replace
from typing import Callable, List, Optional, Tuple

from ..model.architecture import LlamaShape
from ..model.llama import MAX_POSITIONS
from .devices import Device
from .planner import Plan, Strategy, fit
from .step_time import Rates, speed_key

MAXIMIZE = ("micro-batch", "seq-len", "speed")


def never_run_on_npu(s: Strategy) -> List[str]:
    """The parts of a layout llama-npu has never run on an NPU: everything operator-sharded."""
    parts = [f"model {s.model}"] if s.model > 1 else []
    parts += [f"pipeline {s.pipeline}"] if s.pipeline > 1 else []
    return parts + (["optimizer sharding"] if s.optimizer_shard else [])


def never_run_on_card(s: Strategy) -> List[str]:
    """The parts of a plan that have never run on a card for another reason than
    never_run_on_npu's (no NPU in CI, not semi-auto parallel), and are proven on the CPU
    instead. No ranking key: --fit recommends such a plan as before."""
    return ["optimizer on the host"] if s.offload else []


def changed_fields(base: Strategy, s: Strategy) -> List[str]:
    return [f.name for f in fields(Strategy) if getattr(base, f.name) != getattr(s, f.name)]


def rank_key(maximize: Optional[str], shape: LlamaShape, base: Strategy, rates: Rates = Rates()) \
        -> Callable[[Plan], tuple]:
    """The key the recommended plan maximises (module docstring)."""
    def key(plan: Plan) -> tuple:
        s = plan.strategy
        # int8 costs accuracy: the recipe's own LoRA base first, int8 only when nothing else fits
        head = (not never_run_on_npu(s), s.lora == base.lora, s.lora_base_dtype == base.lora_base_dtype,
                s.offload == base.offload)
        speed, fewest = speed_key(plan, rates), -len(changed_fields(base, s))
        if maximize == "speed":
            return head + (speed, -plan.total_bytes)
        if maximize == "micro-batch":
            return head + (s.micro_batch, fewest, speed)
        return head + (fewest, speed)
    return key


def search(shape: LlamaShape, params: int, device: Device, base: Strategy, devices: int, allow_lora: bool,
           maximize: Optional[str], allow_offload: bool = True, rates: Rates = Rates()) -> Tuple[Optional[Plan], Plan]:
    """(recommended plan or None, closest plan): the global batch kept, else (no tested
    layout fits with it) rounded up to a multiple of the devices, which micro-batch 1 on
    data-parallel devices divides."""
    key = rank_key(maximize, shape, base, rates)
    best, closest = fit(shape, params, device, base, devices, allow_lora, rank=key, allow_offload=allow_offload)
    if best is None or never_run_on_npu(best.strategy):
        wider = replace(base, global_batch=-(-base.global_batch // devices) * devices)
        if wider.global_batch != base.global_batch:
            other, _ = fit(shape, params, device, wider, devices, allow_lora, rank=key,
                           allow_offload=allow_offload)
            if other is not None and (best is None or not never_run_on_npu(other.strategy)):
                best = other
    return best, closest


def longest_fitting(shape: LlamaShape, params: int, device: Device, base: Strategy, devices: int,
                    allow_lora: bool, allow_offload: bool = True) -> Tuple[Optional[Plan], Plan]:
    """--maximize seq-len: the recipe's sequence doubled while some plan still fits (up to
    Llama 3.2's context), each length searched for the fewest changes."""
    best, closest = search(shape, params, device, base, devices, allow_lora, None, allow_offload)
    seq_len = base.seq_len * 2
    while best is not None and seq_len <= MAX_POSITIONS:
        longer, _ = search(shape, params, device, replace(base, seq_len=seq_len), devices, allow_lora, None,
                           allow_offload)
        if longer is None:
            break
        best, seq_len = longer, seq_len * 2
    return best, closest


def recommend(shape: LlamaShape, params: int, device: Device, base: Strategy, devices: int, allow_lora: bool,
              maximize: Optional[str], allow_offload: bool = True,
              rates: Rates = Rates()) -> Tuple[Optional[Plan], Plan]:
    if maximize == "seq-len":
        return longest_fitting(shape, params, device, base, devices, allow_lora, allow_offload)
    return search(shape, params, device, base, devices, allow_lora, maximize, allow_offload, rates)


def change_list(base: Strategy, s: Strategy) -> List[str]:
    """Each changed setting, `name old -> new`, with why where the devices forced it."""
    reasons = {}
    if s.data * base.micro_batch and base.global_batch % (base.micro_batch * s.data):
        reasons["micro_batch"] = (f"micro-batch {base.micro_batch} x data {s.data} = {base.micro_batch * s.data} "
                                  f"does not divide the global batch {base.global_batch}")
    if s.global_batch != base.global_batch:
        reasons["global_batch"] = (f"no tested layout on {s.devices} devices fits with the global batch "
                                   f"{base.global_batch}: no micro-batch x data divides it, or none fits in memory")
    return [f"{name} {getattr(base, name)} -> {getattr(s, name)}" + (f" ({reasons[name]})" if name in reasons else "")
            for name in changed_fields(base, s)]
