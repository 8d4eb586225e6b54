"""What drawing a run's pictures (RUN/images/*.png, llama_npu/report/) costs, as a share of the
run's time: the same tiny training run with train.plots true and false, side by side, and one
drawing timed on its own, on the run's curves and on a copy of them 100,000 steps long
(thinned to what a picture shows, it costs about the same).

The drawing runs in a child process after each checkpoint; training does not wait for it,
except for the last one at the end (or a stop), so that the pictures are whole when `train`
returns. On a 2-core machine the child still takes CPU from the step that runs beside it:
the ratio of the two runs' step time is that cost, the end-of-run wait is the rest.

    .venv/bin/python benchmarks/plot_cost.py [--steps 40] [--save-every 10] [--long 100000]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TINY = ["data.max_seq_len=32", "train.micro_batch_size=2", "train.global_batch_size=0", "train.warmup_steps=2",
        "data.eval_files=[]"]


def train(out: Path, steps: int, save_every: int, plots: bool) -> float:
    """Wall seconds of `llama-npu train`; its metrics are in `out`."""
    sets = [*TINY, f"train.max_steps={steps}", f"train.save_every={save_every}", f"train.plots={str(plots).lower()}"]
    begin = time.perf_counter()
    subprocess.run([sys.executable, "-m", "llama_npu", "train", str(REPO / "recipes" / "cpu_smoke.yaml"),
                    "--output-dir", str(out), *[a for s in sets for a in ("--set", s)]],
                   check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    return time.perf_counter() - begin


def draw_seconds(run: Path) -> tuple:
    """(wall, CPU) seconds of one drawing, as train starts it: a child process. On a shared
    machine the CPU seconds are the steadier figure."""
    begin, used = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "llama_npu.report.draw", str(run)], check=True,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter() - begin, after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime


def lengthened(run: Path, into: Path, steps: int) -> Path:
    """A copy of `run` whose metrics.jsonl repeats its records to `steps` steps."""
    shutil.copytree(run, into, ignore=shutil.ignore_patterns("checkpoints", "tensorboard", "images"))
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    with open(into / "metrics.jsonl", "w") as fh:
        for step in range(1, steps + 1):
            fh.write(json.dumps({**records[(step - 1) % len(records)], "step": step}) + "\n")
    (into / "history.jsonl").unlink(missing_ok=True)
    return into


def step_seconds(run: Path) -> float:
    """The steps' own time, the compiling first one left out."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return sum(r["step_seconds"] for r in records[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--long", type=int, default=100_000, help="steps of the lengthened copy")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llama-npu-plot-cost-") as tmp:
        runs = {plots: Path(tmp) / f"plots-{plots}" for plots in (True, False)}
        wall = {plots: train(runs[plots], args.steps, args.save_every, plots) for plots in (False, True)}
        steps = {plots: step_seconds(run) for plots, run in runs.items()}
        one = draw_seconds(runs[True])
        long = draw_seconds(lengthened(runs[True], Path(tmp) / "long", args.long))
        drawings = args.steps // args.save_every + (args.steps % args.save_every > 0)
    print(f"tiny smoke run, {args.steps} steps, a checkpoint every {args.save_every} ({drawings} drawings), "
          f"CPU backend, 2-core machine")
    print(f"one drawing (child process): {one[0]:.2f} s wall, {one[1]:.2f} s CPU on {args.steps} steps; "
          f"{long[0]:.2f} s wall, {long[1]:.2f} s CPU on {args.long:,} steps")
    print(f"drawings' CPU time / steps' time: {drawings * one[1] / steps[True]:.3f} "
          f"({drawings} x {one[1]:.2f} s over {steps[True]:.2f} s)")
    print(f"train wall time:   plots on {wall[True]:.1f} s, off {wall[False]:.1f} s")
    print(f"steps' own time:   plots on {steps[True]:.2f} s, off {steps[False]:.2f} s")
    print(f"ratio plots on / off: wall {wall[True] / wall[False]:.3f}, steps {steps[True] / steps[False]:.3f}")


if __name__ == "__main__":
    main()
