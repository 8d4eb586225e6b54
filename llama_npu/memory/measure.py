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
        import mindspore  # imported here: this module is imported before the run's quiet_frameworks

        return int(mindspore.runtime.max_memory_allocated()), "device"
    return host_peak_rss(), "host_rss"


def host_peak_rss() -> int:
    """This process's peak resident set, in bytes. On Linux from VmHWM, the high-water mark of
    this program's own address space: ru_maxrss also keeps the peak of the address space
    exec() replaced, i.e. of the parent that forked us (a 10 GB test runner made a 3 GB
    training run report 11.6 GB)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is in KiB on Linux, bytes on macOS.
    return int(peak if sys.platform == "darwin" else peak * 1024)


def current_rss() -> int:
    """Resident host memory now (not the peak): what a leak would make grow step by step."""
    import psutil  # imported here, as peak_memory's MindSpore is: the module stays free of imports

    return int(psutil.Process().memory_info().rss)
