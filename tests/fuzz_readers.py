"""The `readers` kind of scripts/fuzz.py (#59): a tiny run's newest step damaged at random
(tests/step_damage.py), then every command that reads a checkpoint run on it, given the step
or the run directory, each in its own process under an address-space and a time limit.

What each run must give: a damaged step given by name is one line and exit 2; given the run
directory, the step is passed over with a warning naming it (eval, generate, ms-to-hf: "using
step_3, not the newest step: step_6 skipped"; train --resume auto: "skipping checkpoint ..."
and "resumed from .../step_3"); a damage no checksum records (checksums.json deleted, a
config.json edit resealed) may also be read. Anything else is counted:
  traceback  a Python traceback or "internal error", or an exit other than 0 and 2
  hang       still running after READER_SECONDS
  memory     killed or failing under MEMORY_LIMIT (a reader whose memory grows with a sidecar)
  silent     a damaged step read with exit 0, not passed over
  broken     exit 2 with more than one line after the error, or no "llama-npu: error:" line
"""
from __future__ import annotations

import collections
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import step_damage

REPO = Path(__file__).resolve().parent.parent
EVAL_DATA = REPO / "data" / "zh_instruct_eval.jsonl"
# A tiny reader maps about 2 GiB with MindSpore loaded; a sidecar read without bound passes 4.
MEMORY_LIMIT = 4 << 30
READER_SECONDS = 300  # a tiny reader takes 1-30 s; one resume trains 3 steps
DEFECTS = ("traceback", "hang", "memory", "silent", "broken")
COLUMNS = ("tried", "refused", "accepted", "passed over", *DEFECTS)


def _argv(reader: str, target: Path, run: Path, out: Path) -> list:
    return {"eval": ["eval", "--checkpoint", target, "--data", EVAL_DATA, "--max-seq-len", "32", "--json"],
            "generate": ["generate", "--checkpoint", target, "--prompt", "你好", "--max-new-tokens", "2"],
            "convert": ["convert", "ms-to-hf", "--src", target, "--dst", out / "hf"],
            "resume": ["train", "--output-dir", run, "--resume", "auto" if target == run else target]}[reader]


# train --resume changes the run (it sets damaged later steps aside and saves): last.
READERS = ("eval", "generate", "convert", "resume")


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def outcome(reader: str, proc, target: Path, run: Path, refuse: bool) -> str:
    """The column one reader's finished process falls in."""
    err = proc.stderr
    if "MemoryError" in err or proc.returncode in (-9, 137):
        return "memory"
    if "Traceback" in err or "internal error" in err or proc.returncode not in (0, 2):
        return "traceback"
    if proc.returncode == 2:
        lines = err.strip().splitlines()
        return "refused" if lines and lines[-1].startswith("llama-npu: error: ") else "broken"
    step = run / "checkpoints" / "step_6"
    if target == run and reader == "resume":
        skipped = f"skipping checkpoint {step}" in err and f"resumed from {run / 'checkpoints' / 'step_3'}" in proc.stdout
    else:
        skipped = target == run and "using step_3, not the newest step: step_6 skipped (" in err
    if skipped:
        return "passed over"
    return "silent" if refuse else "accepted"


def one_case(number: int, seed: int, source: Path, work: Path, readers, counts: dict, shown: set) -> None:
    rng = random.Random(seed * 1_000_003 + number)
    run = step_damage.copy_run(source, work / "run")
    done, refuse = step_damage.damage_at_random(run / "checkpoints" / "step_6", run / "checkpoints" / "step_3", rng)
    target = rng.choice([run, run / "checkpoints" / "step_6"])
    where = "the run directory" if target == run else "the step"
    seen = []
    for reader in readers:
        shutil.rmtree(work / "hf", ignore_errors=True)
        argv = [sys.executable, "-m", "llama_npu", *map(str, _argv(reader, target, run, work))]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=READER_SECONDS, preexec_fn=_limits,
                                  cwd=work, env={**os.environ, "PYTHONPATH": str(REPO)})
            column = outcome(reader, proc, target, run, refuse)
        except subprocess.TimeoutExpired as exc:
            proc, column = exc, "hang"
        counts[reader]["tried"] += 1
        counts[reader][column] += 1
        seen.append(f"{reader} {column}")
        if column in DEFECTS and (reader, column) not in shown:
            shown.add((reader, column))
            tail = "\n".join(str(proc.stderr or "").strip().splitlines()[-12:])
            print(f"--- readers: {reader}: {column}: case {number} ({done}, given {where})\n{tail}", file=sys.stderr)
    print(f"case {number}: {done}, given {where}: {', '.join(seen)}", file=sys.stderr, flush=True)
    shutil.rmtree(work / "run")


def tiny_run(into: Path) -> Path:
    """A six-step tiny run with checkpoints at 3 and 6, as tests/conftest.py's six_step_run."""
    from conftest import SIX_STEPS, SMOKE, run_cli

    run_cli("train", SMOKE, "--output-dir", into, *SIX_STEPS, check=True, cwd=into.parent)
    return into


def fuzz_readers(cases: int, seed: int, readers=READERS, run: Path = None) -> dict:
    """reader -> Counter of COLUMNS over `cases` damaged copies of `run` (a tiny run of six
    steps; one is trained when None)."""
    counts = {reader: collections.Counter() for reader in readers}
    shown: set = set()
    with tempfile.TemporaryDirectory(prefix="llama-npu-fuzz-readers-") as tmp:
        source = Path(run) if run else tiny_run(Path(tmp) / "source")
        for number in range(cases):
            (Path(tmp) / "case").mkdir()
            one_case(number, seed, source, Path(tmp) / "case", readers, counts, shown)
            shutil.rmtree(Path(tmp) / "case")
    return counts
