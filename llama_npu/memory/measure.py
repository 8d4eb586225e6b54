"""Peak memory, from the source that exists on the backend in use.

On Ascend, MindSpore's device counters report device memory. On the CPU backend they return
0 (FACTS.md), so the only measure is the process's peak resident set: host memory, which
says nothing about what the same run would need on an NPU.
"""
from __future__ import annotations

import resource
import sys


def peak_memory(on_ascend: bool) -> tuple[int, str]:
    """(bytes, source) where source is 'device' or 'host_rss'."""
    if on_ascend:
        import mindspore

        return int(mindspore.runtime.max_memory_allocated()), "device"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is in KiB on Linux, bytes on macOS.
    return int(peak if sys.platform == "darwin" else peak * 1024), "host_rss"


def current_rss() -> int:
    """Resident host memory now (not the peak): what a leak would make grow step by step."""
    import psutil

    return int(psutil.Process().memory_info().rss)
