"""The benchmarks docs/profiling-and-benchmarks.md quotes run, at a reduced size, and print their result line.
Their speed figures are not asserted: at these sizes and on a shared machine they mean
nothing; eval's host-memory bound is (it does not depend on the machine's load).
chunked_ce_memory.py is left out: its four child processes take ~40 s even when shrunk."""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.parametrize("script, args, result", [
    ("harness_overhead.py", ["--micro", "1", "--seq", "16", "--steps", "1"], "ratio ours / bare: "),
    ("cpu_throughput.py", ["--micro", "1", "--seq", "16", "--steps", "1", "--matmul", "128",
                           "--small-hidden", "128", "--small-layers", "2"], "fraction of matmul FLOP/s: tiny "),
    ("grad_accum_overhead.py", ["--k", "2", "--micro", "1", "--seq", "16", "--steps", "1", "--runs", "2"],
     "ratio accumulated / one batch: "),
    ("data_prep.py", ["--samples", "200", "--max-seq-len", "64", "--rounds", "1"],
     "ratio prepare-data / tokenizer throughput: unpacked "),
    ("packing.py", ["--max-seq-len", "256"], "ratio best-fit decreasing / in order, effective tokens per step: "),
    # #16: eval's defaults stay under 4 GiB of host RSS on three short texts (CPU backend)
    ("eval_memory.py", ["--long-tokens", "128"], "GiB (under the 4 GiB bound)"),
    # #42: scoring pairs takes at most 1.2 times the host memory of the DPO run on them
    ("pair_eval_memory.py", ["--pairs", "2", "--steps", "1"], "(within the 1.2 goal)"),
    # #22: conversions stream; the round trip is bit-exact (the 1B figure is the README's, measured in full)
    ("convert_memory.py", ["--hidden", "256", "--layers", "2"], "round trip bit-exact; peak RSS "),
    # #41: the CRC-32 pass before a checkpoint is read, beside the read it protects
    ("verified_reads.py", ["--gb", "0.02", "--runs", "1"], "ratio verification / load: "),
    # #40: the host AdamW beside torch's foreach and MindSpore's CPU kernels, and the step with / without offload;
    # #55: then the offload step part by part beside plan's prediction (its last line)
    ("host_optimizer.py", ["--params", "1000000", "--steps", "1", "--hidden", "64", "--layers", "1", "--seq", "16",
                           "--micro", "1", "--k", "2", "--step-steps", "1"],
     "ratio measured / predicted, the whole offload step: "),
    # the host collective KTO's KL estimate sums every step: one cell a process, under msrun
    ("host_collective.py", ["--calls", "2"], "ratio a new cell / one cell, a call: "),
    # #58: the pictures' cost, the same run with train.plots on and off
    ("plot_cost.py", ["--steps", "2", "--save-every", "1", "--long", "5000"], "ratio plots on / off: wall "),
])
def test_benchmark_runs_and_prints_its_result(script, args, result):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert result in proc.stdout
