"""The host collective's cost a call (common/collective.py all_reduce_sum, which KTO's KL
estimate calls every step of a data-parallel run): one summing cell a process, as the code
keeps it, against a new cell every call, which MindSpore compiles again (it keys a compiled
graph by the cell's create_time and id: mindspore/graph/api.py). Both run in the same msrun
launch of 2 CPU workers, the calls alternating; each side's first call (its compile) is left
out of its median. CPU backend: on Ascend the collective is HCCL's and a compile costs more.

    .venv/bin/python benchmarks/host_collective.py [--calls 20]
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RESULT = "ratio a new cell / one cell, a call: "


def worker(calls: int) -> None:
    """In each msrun worker: time both sides alternating; rank 0 prints the result."""
    from _common import cpu_graph_mode

    ms = cpu_graph_mode()
    from mindspore.communication import get_rank, init

    init()
    from llama_npu.common.collective import _summing_cell, all_reduce_sum, stand_alone

    def new_cell():
        with stand_alone():
            return _summing_cell.__wrapped__()(ms.Tensor(np.ones(2, np.float32))).asnumpy()

    sides = {"one cell": lambda: all_reduce_sum(np.ones(2)), "a new cell": new_cell}
    times = {name: [] for name in sides}
    for _ in range(calls + 1):
        for name, call in sides.items():
            start = time.perf_counter()
            summed = call()
            times[name].append(time.perf_counter() - start)
    assert summed.tolist() == [2.0, 2.0], summed  # both ranks took part
    if get_rank() == 0:
        one, new = (float(np.median(times[name][1:])) for name in sides)
        print(f"per call after the first, median of {calls}, 2 CPU ranks: one cell {one * 1e3:.2f} ms, "
              f"a new cell {new * 1e3:.2f} ms")
        print(f"{RESULT}{new / one:.1f}", flush=True)


def launch(calls: int) -> int:
    """This script under msrun with 2 workers; rank 0's lines printed here."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    logs = Path(tempfile.mkdtemp(prefix="host-collective-"))
    try:
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        proc = subprocess.run([str(Path(sys.executable).parent / "msrun"), "--worker_num=2", "--local_worker_num=2",
                               f"--master_port={port}", f"--log_dir={logs}", "--join=True",
                               __file__, "--calls", str(calls)],
                              env=env, capture_output=True, text=True, timeout=600)
        rank0 = (logs / "worker_0.log").read_text() if (logs / "worker_0.log").exists() else ""
        lines = [line for line in rank0.splitlines() if line.startswith(("per call", RESULT))]
        print("\n".join(lines) if lines else rank0[-3000:] + proc.stdout[-2000:] + proc.stderr[-2000:])
        return 0 if proc.returncode == 0 and lines else 1
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    if "MS_ROLE" in os.environ:  # msrun started this process: a worker, or its scheduler (whose init() serves)
        worker(args.calls)
        return 0
    return launch(args.calls)


if __name__ == "__main__":
    sys.exit(main())
