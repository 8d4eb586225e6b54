"""Device profiles for the planner.

`usable_bytes` is MindSpore's memory pool (its max_device_memory): MindFormers' own configs
use 58 GB on 64 GB parts and about 29 GB is the usual ceiling on 32 GB parts. The rest of the
HBM, outside the pool, holds HCCL's buffers and the runtime's (FACTS.md). `--device-memory`
overrides the pool.

GB is MindSpore's: max_device_memory "29GB" is read as 29 x 2^30 bytes (mindspore/runtime/
memory.py set_memory passes float("29") GB on; the C++ AscendMemAdapter::GetDeviceMemSizeFromContext
multiplies by kGBToByte = 1024 << 20), and the HBM sizes it compares with (32 and 64) are in
the same unit. Every size here and in `plan` is in that unit.

A leaf, and the one list of device names: recipe validation (device.name) and the command
line (plan --device) read DEVICE_TARGETS.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

GB = 2**30  # MindSpore's GB (module docstring)
MB = 2**20


class DeviceError(ValueError):
    """An unknown device name or an unreadable memory size: bad input."""


@dataclass(frozen=True)
class Device:
    name: str
    hbm_bytes: int
    usable_bytes: int
    bf16: bool
    note: str
    # CANN's FlashAttentionScore supports Atlas A2/A3 (910B and later), not the 910A; the
    # CPU backend has none either (model.fused_kernels).
    flash_attention: bool = True


DEVICES = {
    "910a": Device("910a", 32 * GB, 29 * GB, False, "Ascend 910A, 32 GB HBM, FP16 only, no flash attention", False),
    "910b": Device("910b", 64 * GB, 58 * GB, True, "Ascend 910B (B2/B3), 64 GB HBM, BF16"),
    "910b4": Device("910b4", 32 * GB, 29 * GB, True, "Ascend 910B4, 32 GB HBM, BF16"),
}
# Every name a recipe's device.name may take -> the device.target it runs on.
DEVICE_TARGETS = {"cpu": "cpu", **{name: "ascend" for name in DEVICES}}
# The most devices a plan takes: plan --fit searches the layouts of the count, in time that
# grows with it (a second at this bound, minutes at 10^8).
MAX_DEVICES = 65536


def cpu_device() -> Device:
    import psutil  # imported here: only the CPU profile reads the host's memory; recipe validation never does

    total = psutil.virtual_memory().total
    return Device("cpu", total, total, False, "host memory of this machine (CPU backend)", False)


def get_device(name: str, memory_override: str = "") -> Device:
    if name == "cpu":
        device = cpu_device()
    elif name in DEVICES:
        device = DEVICES[name]
    else:
        raise DeviceError(f"unknown device {name!r}; expected one of {', '.join(DEVICE_TARGETS)}")
    if memory_override:
        device = replace(device, usable_bytes=parse_bytes(memory_override),
                         note=device.note + f", usable memory set to {memory_override}")
    return device


def parse_bytes(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(GB|G|MB|M)?\s*", text, re.IGNORECASE)
    if not match:
        raise DeviceError(f"device memory {text!r}: expected a size such as 28GB or 512MB")
    value, unit = float(match.group(1)), (match.group(2) or "GB").upper()
    return int(value * (GB if unit.startswith("G") else MB))
