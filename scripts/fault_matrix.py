"""The fault-injection matrix of scripts/launch.sh: a 2-worker data-parallel launch of the
smoke recipe on the CPU, one fault at one moment, then the command the launch printed, and
the resumed run's losses against those of an uninterrupted launch. Real signals and a real
file-size limit (RLIMIT_FSIZE set on the running worker with prlimit); nothing is mocked.

    python scripts/fault_matrix.py [--cells FAULT:MOMENT ...] [--chain] [--json FILE]

Faults: sigint_launch, sigterm_launch (to launch.sh), sigterm_worker (rank 1), sigkill_worker
(rank 0, the rank that saves a data-parallel run), disk_full (rank 0's checkpoint write).
Moments: compile (the first step, compiling its graph), mid_step (between two saves),
mid_save (while step 6's checkpoint is being written). A launch is 8 steps, saving at 3 and 6.
Prints one row a cell: the launch's exit status and last line, the step the printed command
resumed from, the steps trained twice, and whether every step's loss equals the
uninterrupted run's (to 1e-6). Each cell costs two launches (~30-60 s each on 2 cores).
--chain costs one launch a cell and one more: each cell's fault goes into the launch that
resumes the cell before it, in one run directory, whose losses at the end are every cell's.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "recipes" / "cpu_smoke.yaml"
STEPS, SAVE_EVERY = 8, 3
ARGS = ["--set", "data.max_seq_len=32", "--set", "train.micro_batch_size=2", "--set", "train.global_batch_size=0",
        "--set", "train.warmup_steps=2", "--set", "data.eval_files=[]", "--set", f"train.max_steps={STEPS}",
        "--set", f"train.save_every={SAVE_EVERY}", "--set", "train.keep_last=3"]
FAULTS = ("sigint_launch", "sigterm_launch", "sigterm_worker", "sigkill_worker", "disk_full")
MOMENTS = ("compile", "mid_step", "mid_save")
SAVED_MID_RUN = 2 * SAVE_EVERY  # the step whose save `mid_save` hits


@dataclass
class Cell:
    fault: str
    moment: str
    exit_status: Optional[int] = None
    seconds_to_exit: Optional[float] = None
    last_line: str = ""
    ranks_stopped_at: tuple = ()  # the step each rank's "stopped by ... after step N" names
    resumed_from: Optional[int] = None
    steps_lost: Optional[int] = None
    exact: Optional[bool] = None
    note: str = ""


def _port() -> str:
    return str(random.randint(20000, 40000))


def launch(args, logs: Path, env: Optional[dict] = None) -> subprocess.Popen:
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MASTER_PORT": _port(), "LOG_DIR": str(logs / "msrun"), **(env or {})}
    return subprocess.Popen(["bash", *map(str, args)], cwd=REPO, env=env, start_new_session=True,
                            stdout=open(logs / "stdout", "w"), stderr=open(logs / "stderr", "w"))


def worker_pid(port: str, rank: int) -> Optional[int]:
    """The pid of the worker of `rank` of the launch on `port` (msrun gives it MS_SCHED_PORT)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = dict(kv.split("=", 1) for kv in (proc / "environ").read_bytes().decode().split("\0") if "=" in kv)
            comm = (proc / "comm").read_text().strip()
        except OSError:
            continue
        if (env.get("MS_ROLE") == "MS_WORKER" and env.get("RANK_ID") == str(rank) and comm != "tail"
                and env.get("MS_SCHED_PORT") == port):
            return int(proc.name)
    return None


@dataclass
class Before:
    """What the run directory held when a launch started: what an earlier, stopped launch left
    there is no progress of the new one."""
    metrics_inode: Optional[int] = None  # a resumed run replaces metrics.jsonl, dropping the steps it redoes
    partial_saves: frozenset = frozenset()

    @classmethod
    def of(cls, out: Path) -> "Before":
        path = out / "metrics.jsonl"
        return cls(path.stat().st_ino if path.exists() else None, frozenset(partial_saves(out)))


def partial_saves(out: Path) -> set:
    return set((out / "checkpoints").glob(f".step_{SAVED_MID_RUN}.partial-*"))


def metric_steps(out: Path, before: Before = Before()) -> list:
    path = out / "metrics.jsonl"
    if not path.exists() or path.stat().st_ino == before.metrics_inode:
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def wait_for(condition, proc, what: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise RuntimeError(f"the launch ended (exit {proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.01)


def wait_for_moment(moment: str, proc, out: Path, logs: Path, before: Before) -> None:
    if moment == "compile":  # both ranks are in the first step, compiling its graph
        wait_for(lambda: all("the first step compiles" in _read(logs / "msrun" / f"worker_{r}.log") for r in (0, 1))
                 and not metric_steps(out, before), proc, "the first step")
    elif moment == "mid_step":
        wait_for(lambda: len(metric_steps(out, before)) >= SAVE_EVERY + 1, proc, f"step {SAVE_EVERY + 1}")
    else:  # the hidden staging directory of step 6's checkpoint exists: its files are being written
        wait_for(lambda: bool(partial_saves(out) - before.partial_saves), proc, f"the save of step {SAVED_MID_RUN}")


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def inject(fault: str, proc, port: str) -> None:
    if fault == "sigint_launch":
        proc.send_signal(signal.SIGINT)
    elif fault == "sigterm_launch":
        proc.send_signal(signal.SIGTERM)
    else:
        rank = 1 if fault == "sigterm_worker" else 0
        pid = worker_pid(port, rank)
        if pid is None:
            raise RuntimeError(f"rank {rank}'s worker not found")
        if fault == "disk_full":  # every file rank 0 writes from now on is capped at 16 MiB; model.ckpt needs 33
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
        else:
            os.kill(pid, signal.SIGTERM if fault == "sigterm_worker" else signal.SIGKILL)


def continue_command(stderr: str) -> tuple[dict, list]:
    """(environment, words) of the `continue with:` line launch.sh printed last."""
    line = next(line for line in reversed(stderr.splitlines()) if "continue with: " in line)
    words = shlex.split(line.split("continue with: ", 1)[1])
    env = {}
    while "=" in words[0] and not words[0].startswith("-"):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    env["MASTER_PORT"] = _port()  # a fresh port: the last launch's may linger in TIME_WAIT
    return env, words


def losses(out: Path) -> dict:
    return {r["step"]: r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


def same_losses(out: Path, reference: dict) -> bool:
    got = losses(out)
    return sorted(got) == sorted(reference) and all(abs(got[s] - reference[s]) <= 1e-6 for s in reference)


def not_applicable(cell: Cell) -> bool:
    if cell.fault == "disk_full" and cell.moment != "mid_save":
        cell.note = "n/a: a full disk matters only when a checkpoint is written"
    return bool(cell.note)


def fresh_launch(out: Path) -> list:
    return ["scripts/launch.sh", SMOKE, 2, "--output-dir", out, *ARGS]


def fault_launch(cell: Cell, words: list, env: dict, out: Path, logs: Path) -> tuple[str, int]:
    """Start `words`, inject the cell's fault at its moment and note how the launch ended:
    (its stderr, the last step it logged)."""
    before, port = Before.of(out), _port()
    proc = launch(words, logs, {**env, "MASTER_PORT": port})
    # The disk fills before step 6's save starts, not during it: set the limit after step 4.
    wait_for_moment("mid_step" if cell.fault == "disk_full" else cell.moment, proc, out, logs, before)
    inject(cell.fault, proc, port)
    injected = time.monotonic()
    cell.exit_status = proc.wait(timeout=600)
    cell.seconds_to_exit = round(time.monotonic() - injected, 1)
    stderr = _read(logs / "stderr")
    said = [line for line in stderr.splitlines() if not line.startswith("launch: continue with: ")]
    cell.last_line = said[-1].split("; continue with: ")[0] if said else ""
    cell.ranks_stopped_at = tuple(int(m.group(1)) for r in (0, 1) if (m := re.search(
        r"stopped by [\w ]+? after step (\d+)", _read(logs / "msrun" / f"worker_{r}.log"))))
    return stderr, max(metric_steps(out), default=0)


def stop(cell: Cell, words: list, env: dict, out: Path, work: Path, reference: dict, earlier=()) -> Optional[tuple]:
    """The cell's fault in the launch of `words`: (cell, stderr, steps logged) if it stopped the
    launch; if the launch finished instead, its losses are the cell's and the `earlier` cells'."""
    try:
        stderr, trained = fault_launch(cell, words, env, out, work / "logs")
    except RuntimeError as exc:
        cell.note = f"not run: {exc}"
        return None
    if cell.exit_status:
        return cell, stderr, trained
    cell.steps_lost, cell.note = 0, "finished: the stop request reached the last step"
    for done in (cell, *earlier):
        done.exact = same_losses(out, reference)
    return None


def resumed(stopped: tuple, logs: Path) -> None:
    """The step the launch logging under `logs` resumed a stopped launch, (cell, stderr, steps
    logged), from."""
    cell, _, trained = stopped
    worker_log = _read(logs / "msrun" / "worker_0.log")
    marker = next((line for line in worker_log.splitlines() if "resumed from" in line), "")
    cell.resumed_from = int(marker.rsplit(" ", 1)[1]) if marker else 0
    cell.steps_lost = trained - cell.resumed_from


def finish(stopped: list, out: Path, work: Path, reference: dict) -> None:
    """Run the command the last of the `stopped` launches printed to the end: each one's
    losses are then the run directory's."""
    env, words = continue_command(stopped[-1][1])
    logs = work / "resumed"
    if launch(words, logs, env).wait(timeout=900) != 0:
        stopped[-1][0].note = f"the resumed launch failed: {_read(logs / 'stderr').strip().splitlines()[-1:]}"
        return
    resumed(stopped[-1], logs)
    for cell, _, _ in stopped:
        cell.exact = same_losses(out, reference)


def run_cell(cell: Cell, reference: dict, work: Path) -> None:
    """The cell on a launch of its own, then the command it printed."""
    out = work / "run"
    stopped = stop(cell, fresh_launch(out), {}, out, work, reference)
    if stopped:
        finish([stopped], out, work, reference)


def run_chain(cells: list, reference: dict, work: Path) -> None:
    """Each cell's fault in the launch that resumes the cell before it, on one run directory;
    the last one's printed command runs to the end."""
    out, chained = work / "run", []
    for cell in cells:
        if chained is None:
            cell.note = "not run: the chain ended before it"
            continue
        cell_work = work / f"{cell.fault}-{cell.moment}"
        env, words = continue_command(chained[-1][1]) if chained else ({}, fresh_launch(out))
        stopped = stop(cell, words, env, out, cell_work, reference, [c for c, _, _ in chained])
        if chained:
            resumed(chained[-1], cell_work / "logs")
        chained = [*chained, stopped] if stopped else None
    if chained:
        finish(chained, out, cell_work, reference)


def reference_run(work: Path) -> dict:
    out, logs = work / "run", work / "logs"
    proc = launch(fresh_launch(out), logs)
    if proc.wait(timeout=900) != 0:
        raise RuntimeError(f"the uninterrupted launch failed: {_read(logs / 'stderr')[-2000:]}")
    return losses(out)


def table(cells) -> str:
    rows = [("fault", "moment", "exit", "s to exit", "resumed from", "steps lost", "exact", "last line / note")]
    for c in cells:
        rows.append((c.fault, c.moment, *("" if v is None else str(v) for v in
                                          (c.exit_status, c.seconds_to_exit, c.resumed_from, c.steps_lost)),
                     {True: "yes", False: "NO", None: ""}[c.exact], c.note or c.last_line[:110]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)) + "  " + r[-1] for r in rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", nargs="+", metavar="FAULT:MOMENT",
                        default=[f"{f}:{m}" for f in FAULTS for m in MOMENTS])
    parser.add_argument("--json", type=Path, help="also write the cells as JSON here")
    parser.add_argument("--work", type=Path, help="keep every launch's directory here (default: a temporary one)")
    parser.add_argument("--chain", action="store_true",
                        help="inject each cell's fault into the launch resuming the cell before it")
    parser.add_argument("--reference", type=Path, metavar="RUN_DIR",
                        help="an uninterrupted launch of the same arguments to compare with (default: run one)")
    args = parser.parse_args(argv)
    cells_asked = [tuple(c.split(":", 1)) for c in args.cells]
    for fault, moment in cells_asked:
        if fault not in FAULTS or moment not in MOMENTS:
            parser.error(f"--cells {fault}:{moment}: expected FAULT:MOMENT with FAULT in {', '.join(FAULTS)} and "
                         f"MOMENT in {', '.join(MOMENTS)}")
    work = args.work or Path(tempfile.mkdtemp(prefix="fault-matrix-"))
    reference = losses(args.reference) if args.reference else reference_run(work / "reference")
    cells = [Cell(fault, moment) for fault, moment in cells_asked]
    if args.chain:
        run_chain([c for c in cells if not not_applicable(c)], reference, work)
    for cell in [] if args.chain else cells:
        if not not_applicable(cell):
            run_cell(cell, reference, work / f"{cell.fault}-{cell.moment}")
        print(table([cell]).splitlines()[-1], file=sys.stderr, flush=True)
    print(table(cells))
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in cells], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
