"""Questions per second and peak host RSS of `llama-npu eval --task ceval` on the CPU, for
the tiny preset (Llama 3.2's full 128,256-token vocabulary, random weights).

Each configuration runs the real command in its own child process on a C-Eval-layout
directory of --questions questions (the shipped sample's, repeated over its four subjects):
0-shot and 5-shot, --batch-size 1 and 8. The scoring time is the command's own
(`scoring_seconds` in --json: prompts built and scored, without start-up and model build;
the graph compiles of each length bucket are included, as a real run pays them once); the
RSS is the child's own peak (VmHWM, benchmarks/child_peak.py). The ratio line compares batch 8 with batch 1, measured side by side.

This is host memory and CPU speed, not NPU figures (FACTS.md); docs/evaluation-and-export.md
says what the design gives on Ascend.

    .venv/bin/python benchmarks/exam_throughput.py [--questions 64] [--runs 0x1,0x8,5x8]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import tempfile
from pathlib import Path

from child_peak import run_with_peak
from eval_memory import write_checkpoint

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "data" / "ceval_sample"


def write_questions(root: Path, count: int) -> None:
    """`count` val questions over the sample's subjects (its rows repeated), and its dev split."""
    import shutil

    shutil.copytree(SAMPLE / "dev", root / "dev")
    subjects = sorted(p.name[: -len("_val.csv")] for p in (SAMPLE / "val").glob("*_val.csv"))
    (root / "val").mkdir(parents=True)
    for i, subject in enumerate(subjects):
        with (SAMPLE / "val" / f"{subject}_val.csv").open(encoding="utf-8") as fh:
            reader = csv.reader(fh)
            header, rows = next(reader), list(reader)
        wanted = count // len(subjects) + (i < count % len(subjects))
        with (root / "val" / f"{subject}_val.csv").open("w", encoding="utf-8", newline="") as fh:
            writer = csv.writer(fh, lineterminator="\n")
            writer.writerow(header)
            writer.writerows([str(n)] + rows[n % len(rows)][1:] for n in range(wanted))


def measure(checkpoint: Path, data: Path, shots: int, batch: int, work: Path) -> tuple[dict, int]:
    """(the command's --json summary, its peak RSS in bytes)."""
    out, err = work / "out", work / "err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        code, peak = run_with_peak(["eval", "--task", "ceval", "--checkpoint", checkpoint, "--data", data, "--shots",
                                    shots, "--batch-size", batch, "--device", "cpu", "--json"],
                                   cwd=REPO, stdout=stdout, stderr=stderr)
    if code != 0:
        raise SystemExit(f"eval --shots {shots} --batch-size {batch} failed:\n{err.read_text()[-3000:]}")
    return json.loads(out.read_text()), peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--runs", default="0x1,0x8,5x8", help="SHOTSxBATCH configurations, comma-separated")
    args = parser.parse_args()
    runs = [tuple(int(v) for v in run.split("x")) for run in args.runs.split(",")]
    os.environ.setdefault("GLOG_v", "3")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_checkpoint(work / "tiny")
        write_questions(work / "ceval", args.questions)
        print(f"{'shots':>5} {'batch':>5} {'questions':>9} {'scoring s':>9} {'questions/s':>11} {'peak RSS GiB':>12}")
        rates = {}
        for shots, batch in runs:
            result, peak = measure(work / "tiny", work / "ceval", shots, batch, work)
            n, seconds = result["overall"]["n"], result["scoring_seconds"]
            rates[shots, batch] = n / seconds
            print(f"{shots:>5} {batch:>5} {n:>9} {seconds:>9.2f} {n / seconds:>11.2f} {peak / 2**30:>12.2f}")
        if (0, 1) in rates and (0, 8) in rates:
            print(f"ratio batch 8 / batch 1, 0-shot questions per second: {rates[0, 8] / rates[0, 1]:.2f}")


if __name__ == "__main__":
    main()
