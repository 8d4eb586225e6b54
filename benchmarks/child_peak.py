"""Run `llama-npu ARGS` in a child process and return its own peak host RSS.

The peak is the child's VmHWM, read by the child itself as it exits
(llama_npu.memory.measure.host_peak_rss, what a training run reports). wait4's ru_maxrss is
not used: Linux carries the high-water mark across exec(), so it is at least the parent's
resident set at fork time, and a benchmark parent holding MindSpore (about 1 GB) would be
reported for a child that peaked lower.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

# The atexit hook is registered before llama_npu (and MindSpore) is imported, so it runs last,
# after their own exit hooks, and sees the whole run's high-water mark.
_WRAPPER = """\
import atexit, resource, sys
report = sys.argv.pop(1)
def _write_peak():
    from llama_npu.memory.measure import host_peak_rss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    with open(report, "w") as fh:
        fh.write(f"{host_peak_rss()} {children}")
atexit.register(_write_peak)
sys.argv[0] = "llama-npu"
import runpy
runpy.run_module("llama_npu", run_name="__main__")
"""


def run_with_peaks(args, **popen) -> tuple[int, int, int]:
    """(exit code, peak RSS in bytes, the largest peak of the processes it started and waited
    for) of `llama-npu ARGS`; `popen` goes to subprocess.run. The second is wait4's ru_maxrss
    of its children: at least the child's own resident set when it started them."""
    with tempfile.TemporaryDirectory(prefix="peak-") as tmp:
        report = Path(tmp) / "peak"
        proc = subprocess.run([sys.executable, "-c", _WRAPPER, str(report), *map(str, args)], **popen)
        own, children = map(int, report.read_text().split()) if report.exists() else (0, 0)
    return proc.returncode, own, children


def run_with_peak(args, **popen) -> tuple[int, int]:
    """(exit code, peak RSS in bytes) of `llama-npu ARGS`; `popen` goes to subprocess.run."""
    code, own, _ = run_with_peaks(args, **popen)
    return code, own

