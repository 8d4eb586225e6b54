"""A plan's predicted step time, part by part: the card's compute, the PCIe transfers and the
host's work with the optimizer on the host. Nothing overlaps today: the step runs each
micro-batch's graph, then copies its gradients off the card and adds them on the host, and
after the last one the host's step-end passes and the push back (steps/host/step.py), so
the parts add. Beside the total: the step if the host's accumulation of a micro-batch ran
while the card computed the next one: the prize of overlapping them (ZeRO-Offload's delayed
parameter update overlaps the host's update with the card's next step in the same spirit).

- compute: FLOPs a device does a step over peak x MFU. The peak is memory/peaks.py's (or
  --peak-tflops); unknown, the compute and the total are unknown, never guessed. FLOPs a token:
  6 x parameters for a full fine-tune, 4 under LoRA (no weight gradients for the frozen base,
  strategies/lora.py); attention's 12 x layers x hidden x sequence (PaLM, Chowdhery et al.
  2022, appendix B: QK^T and AV, forward and backward, no causal saving counted); recompute's
  forward again (strategies/recompute.py, plus the recomputed layers' attention forward);
  chunked cross-entropy's head again (strategies/chunked_ce.py); the reference forward of the
  objectives that have one (2 x parameters plus attention's forward). Model and pipeline
  parallel divide it; the 1F1B bubble is its own part.
- PCIe (optimizer on the host, on a card): the gradients of each micro-batch to the host and
  the weights back (strategies/offload.py transfer_bytes) at one direction of PCIe 4.0 x16.
- host: strategies/offload.py host_passes, bytes over the rank's shard at --host-bandwidth.
Not counted: collectives (data, model and pipeline parallel), the in-graph update on the card
(memory-bound on HBM, no sourced bandwidth), the input pipeline.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..strategies import STRATEGIES, lora, offload, precision
from .peaks import device_peak

# The fraction of the peak a step reaches when --mfu does not say: MindFormers' own llama-7B
# full fine-tune on a 910A, 1,229 tokens/s a card at 2,048 tokens (selftest/speed.py), is
# 6 x 6.74e9 x 1,229 / 256e12 = 0.194 of its peak.
DEFAULT_MFU = 0.19
MFU_SOURCE = ("MindFormers' llama-7B full fine-tune on a 910A, 1,229 tokens/s a card: "
              "6 x 6.74e9 x 1,229 / 256e12 = 0.19")
HOST_BANDWIDTH_SOURCE = "a 2-core x86_64 host's two-thread streaming add, 21.6 GB/s (FACTS.md)"
PCIE_SOURCE = "one direction of PCIe 4.0 x16 as a copy reaches it (32 nominal)"


@dataclass(frozen=True)
class Rates:
    """What turns FLOPs and bytes into seconds (plan's --mfu, --peak-tflops, --host-bandwidth)."""
    mfu: float = DEFAULT_MFU
    peak_tflops: Optional[float] = None  # given: overrides memory/peaks.py
    host_bandwidth: float = offload.DEFAULT_HOST_BANDWIDTH  # 10^9 bytes/s a rank


def compute_dtype(s) -> str:
    return "float32" if s.amp_level == "O0" else s.dtype


def peak(plan, rates: Rates) -> tuple:
    """(TFLOPS or None, where the figure comes from or why it is unknown)."""
    if rates.peak_tflops:
        return rates.peak_tflops, "--peak-tflops"
    found, why = device_peak(plan.device.name, compute_dtype(plan.strategy))
    if found is None:
        return None, f"unknown peak: {why}; give --peak-tflops"
    return found.tflops, f"{found.chip}: {found.source}"


def compute_flops(shape, params: int, s) -> dict:
    """FLOPs one device does a step, by part (module docstring), with each one's formula."""
    tokens = s.rows * s.seq_len * s.accumulation  # a data-parallel replica's, a step
    split = s.model * s.pipeline
    attention_forward = 4 * shape.num_layers * shape.hidden_size * s.seq_len  # a token
    per = lora.flops_per_parameter(s)
    parts = {"model": (per * params * tokens, f"{per} x {params:,} parameters x {tokens:,} tokens"),
             "attention": (3 * attention_forward * tokens,
                           f"12 x {shape.num_layers} layers x {shape.hidden_size} hidden x {s.seq_len} seq x "
                           f"{tokens:,} tokens")}
    for strategy in STRATEGIES:  # recompute's forward again, chunked CE's head again
        extra = strategy.extra_flops(shape, params, s) if hasattr(strategy, "extra_flops") else 0
        if extra:
            parts[strategy.KEY] = (extra * tokens,
                                   f"{extra:,.0f} FLOPs a token x {tokens:,} tokens (strategies/{strategy.KEY}.py)")
    if s.reference_forward:
        parts["reference"] = ((2 * params + attention_forward) * tokens,
                              f"the objective's reference forward: (2 x {params:,} + attention's forward) x {tokens:,} "
                              f"tokens")
    return {name: (flops / split, what + (f" / {split} devices" if split > 1 else "")) for name, (flops, what)
            in parts.items()}


def transfer_and_host(plan, rates: Rates) -> dict:
    """(bytes, seconds, what) of the PCIe transfers and the host's passes a step."""
    s = plan.strategy
    if not offload.planned_on_host(s):
        return {}
    cb, shard = precision.activation_bytes(s), offload.host_shard(plan.params, s)
    parts = {}
    if plan.device.name != "cpu":  # on the CPU backend asnumpy shares the output's memory: no copy
        moved = offload.transfer_bytes(plan.params, s, cb)
        parts["pcie_gradients_to_host"] = (moved["to_host"], offload.PCIE_BANDWIDTH,
                                           f"{s.accumulation} x {cb} B x {shard:,}")
        parts["pcie_weights_to_card"] = (moved["to_device"], offload.PCIE_BANDWIDTH, f"{cb} B x {shard:,}")
    passes = offload.host_passes(s, cb)
    for name, count in (("accumulate", s.accumulation), ("step_end", 1), ("push", 1)):
        per = sum(passes[name].values())
        times = f"{count} x " if count > 1 else ""
        each = ", ".join(f"{k} {v}" for k, v in passes[name].items())
        parts[f"host_{name}"] = (count * per * shard, rates.host_bandwidth, f"{times}{per} B x {shard:,} ({each})")
    return {name: {"bytes": n, "seconds": n / (gbs * 1e9), "what": what} for name, (n, gbs, what) in parts.items()}


def step_time(plan, rates: Rates = Rates()) -> dict:
    """The predicted step: each part's seconds (None where the peak is unknown), their sum,
    and the step with the host's accumulation overlapped with the card's next micro-batch."""
    s = plan.strategy
    tflops, peak_source = peak(plan, rates)
    rate = tflops * 1e12 * rates.mfu if tflops else None
    parts = {name: {"flops": flops, "seconds": flops / rate if rate else None, "what": what}
             for name, (flops, what) in compute_flops(plan.shape, plan.params, s).items()}
    card = sum(p["flops"] for p in parts.values()) / rate if rate else None
    bubble = (s.pipeline - 1) / s.accumulation if s.pipeline > 1 else 0.0  # 1F1B: (p - 1) micro-batches idle
    if bubble:
        parts["pipeline_bubble"] = {"seconds": card * bubble if rate else None,
                                    "what": f"1F1B: {s.pipeline - 1} of {s.accumulation} micro-batches idle"}
    parts.update(transfer_and_host(plan, rates))
    known = [p["seconds"] for p in parts.values() if p["seconds"] is not None]
    total = sum(known) if len(known) == len(parts) else None
    return {"parts": {name: p["seconds"] for name, p in parts.items()}, "details": parts,
            "total_seconds": total, "known_seconds": sum(known), "peak_tflops": tflops, "peak_source": peak_source,
            "compute_dtype": compute_dtype(s), "mfu": rates.mfu,
            "mfu_source": "--mfu" if rates.mfu != DEFAULT_MFU else MFU_SOURCE,
            "host_bandwidth_gbs": rates.host_bandwidth, "pcie_bandwidth_gbs": offload.PCIE_BANDWIDTH,
            "host_bandwidth_source": "--host-bandwidth" if rates.host_bandwidth != offload.DEFAULT_HOST_BANDWIDTH
            else f"the default: {HOST_BANDWIDTH_SOURCE}", "pcie_source": PCIE_SOURCE,
            "overlap": "none: every part adds (steps/host/step.py runs them one after another)",
            **overlap_prize(parts, s, total)}


def overlap_prize(parts: dict, s, total: Optional[float]) -> dict:
    """The step if the host added micro-batch i's gradients while the card computed micro-batch
    i + 1: a two-stage pipeline over k micro-batches saves (k - 1) x the shorter stage."""
    host = parts.get("host_accumulate")
    if host is None or s.accumulation < 2:
        return {"overlapped_seconds": total, "prize_seconds": 0.0}
    if total is None:
        return {"overlapped_seconds": None, "prize_seconds": None}
    card_names = [n for n in parts if n not in ("host_accumulate", "host_step_end", "host_push",
                                                 "pcie_weights_to_card")]
    card = sum(parts[n]["seconds"] for n in card_names) / s.accumulation  # a micro-batch's compute and copy
    prize = (s.accumulation - 1) * min(card, host["seconds"] / s.accumulation)
    return {"overlapped_seconds": total - prize, "prize_seconds": prize}


def speed_key(plan, rates: Rates = Rates()) -> tuple:
    """What `plan --fit --maximize speed` ranks plans of one device by, higher first: the
    tokens a second of the predicted step; where the peak is unknown, the fewest FLOPs a token,
    then the fewest seconds of the parts that are known (transfers, host) a token. Ties (the
    same FLOPs a token) go to fewer micro-batches a step: each costs the card a pass over the
    accumulators, selftest's speed_accumulation_overhead bound."""
    s = plan.strategy
    tokens = s.rows * s.seq_len * s.accumulation * s.data
    time = step_time(plan, rates)
    if time["total_seconds"]:
        head = (1, round(tokens / time["total_seconds"], 3))
    else:
        flops = sum(d.get("flops", 0) for d in time["details"].values()) * s.model * s.pipeline / tokens * s.data
        head = (0, -round(flops), -round(time["known_seconds"] / tokens, 12))
    return head + (-s.accumulation,)


def _amount(detail: dict) -> str:
    if "flops" in detail:
        return f"{detail['flops']:.3e} FLOPs"
    return f"{detail['bytes'] / 1e9:.2f} GB"  # decimal, as the bandwidths that time them


def format_step_time(time: dict) -> list:
    """plan's lines for `time` (step_time's): each part, its amount and seconds, their sum."""
    seconds = lambda v: f"{v:.2f}" if v is not None else "unknown"  # noqa: E731
    lines = ["  step time, predicted (nothing overlaps today: every part adds)"]
    if time["peak_tflops"]:
        lines.append(f"    card compute at MFU {time['mfu']:g} of {time['peak_tflops']:g} TFLOPS "
                     f"{time['compute_dtype']} "
                     f"(peak: {time['peak_source']}; MFU: {time['mfu_source']})")
    else:
        lines.append(f"    card compute: {time['peak_source']}")
    if any(name.startswith("host_") for name in time["parts"]):
        lines.append(f"    host passes: their bytes at {time['host_bandwidth_gbs']:g} GB/s "
                     f"({time['host_bandwidth_source']}), a floor (benchmarks/host_optimizer.py times them); "
                     f"PCIe at {time['pcie_bandwidth_gbs']:g} GB/s ({time['pcie_source']})")
    lines.append(f"    {'part':<24}{'seconds':>10}  {'amount':<18}what")
    for name, detail in time["details"].items():
        amount = _amount(detail) if "flops" in detail or "bytes" in detail else ""
        lines.append(f"    {name:<24}{seconds(detail['seconds']):>10}  {amount:<18}{detail['what']}")
    if time["total_seconds"] is None:
        lines.append(f"    {'total':<24}{'unknown':>10}  the card's compute is unknown without a peak; the other parts "
                     f"add to {time['known_seconds']:.2f} s")
        return lines
    lines.append(f"    {'total':<24}{time['total_seconds']:>10.2f}  the sum of the parts above")
    if time["prize_seconds"]:
        lines.append(f"    if the host's accumulation of a micro-batch overlapped the card's next micro-batch: "
                     f"{time['overlapped_seconds']:.2f} s a step ({time['prize_seconds']:.2f} s less)")
    return lines
