"""The chips' peak matmul throughput: one table, read by plan's step time (memory/step_time.py)
and by selftest's MFU (selftest/speed.py). Each entry names its source or how it was derived;
a chip with neither has no entry, and its peak is "unknown": plan then takes --peak-tflops,
never a guess.

A device name of the catalogue (memory/devices.py) may stand for several chips: `910b` is the
910B2 and the 910B3 (both 64 GB). Its peak is theirs only where they share one from the same
source; they do not (the B2's is derived, the B3's unpublished), so `910b` has none.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass(frozen=True)
class Peak:
    chip: str
    tflops: float  # 10^12 FLOPs/s, dense matmul, inputs in the dtype the table keys it by
    source: str


PEAKS = {
    ("910a", "float16"): Peak("Ascend 910 (910A)", 256.0,
                              "Huawei's published figure (Ascend 910 launch and Hot Chips 31, 2019: 256 TFLOPS FP16, "
                              "32 Da Vinci cores)"),
    ("910b2", "float16"): Peak("Ascend 910B2", 354.0,
                               "derived, not published: 24 AI cores x 4,096 FP16 MACs a cycle x 2 FLOPs x 1.8 GHz "
                               "= 353.9 TFLOPS"),
}
# The chips each device name of the catalogue stands for.
CHIPS = {"910a": ("910a",), "910b": ("910b2", "910b3"), "910b4": ("910b4",), "cpu": ("cpu",)}
# Why a chip has no entry.
NO_SOURCE = {"910b3": "the 910B3's is neither published nor derived",
             "910b4": "the 910B4's is neither published nor derived",
             "cpu": "a CPU's depends on the host (benchmarks/cpu_throughput.py measures this one's matmul rate)"}


def chip_peak(chip: str, dtype: str) -> Tuple[Optional[Peak], str]:
    """(the chip's peak or None, why none)."""
    found = PEAKS.get((chip, dtype))
    if found:
        return found, ""
    if chip in NO_SOURCE:
        return None, NO_SOURCE[chip]
    return None, f"the {chip}'s {dtype} peak has no source (its table entries are for other dtypes)"


def device_peak(device: str, dtype: str) -> Tuple[Optional[Peak], str]:
    """(the peak of every chip `device` stands for, when they share one, or None; the reason
    when None, naming each chip's figure or its absence)."""
    found = [chip_peak(chip, dtype) for chip in CHIPS.get(device, (device,))]
    if len(found) == 1:
        return found[0]
    if all(peak is not None for peak, _ in found) and len({(p.tflops, p.source) for p, _ in found}) == 1:
        return found[0]
    named = [f"{chip} {peak.tflops:g} TFLOPS, {peak.source}" if peak else why
             for chip, (peak, why) in zip(CHIPS[device], found)]
    chips = " and the ".join(CHIPS[device])
    return None, f"{device} stands for the {chips}, without one {dtype} peak ({'; '.join(named)})"


def peak_flops(device: str, dtype: str) -> Optional[float]:
    """FLOPs/s, or None where the peak is unknown."""
    peak, _ = device_peak(device, dtype)
    return peak.tflops * 1e12 if peak else None
