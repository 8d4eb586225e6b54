"""The fault-injection matrix of scripts/launch.sh: a 2-worker data-parallel launch of the
smoke recipe on the CPU, one fault at one moment, then the command the launch printed, and
the resumed run's losses against those of an uninterrupted launch. Real signals and a real
file-size limit (RLIMIT_FSIZE set on the running worker with prlimit); nothing is mocked.

    python scripts/fault_matrix.py [--cells FAULT:MOMENT ...] [--chain] [--two-nodes] [--json FILE]

Faults: sigint_launch, sigterm_launch (to launch.sh), sigterm_worker (rank 1), sigkill_worker
(rank 0, the rank that saves a data-parallel run), disk_full (rank 0's checkpoint write),
sigkill_rank1 (kill -9 of rank 1, the other node's worker under --two-nodes).
Moments: compile (the first step, compiling its graph), mid_step (between two saves),
mid_save (while step 6's checkpoint is being written). A launch is 8 steps, saving at 3 and 6.
Prints one row a cell: the launch's exit status and last line, the step the printed command
resumed from, the steps trained twice, and whether every step's loss equals the
uninterrupted run's (to 1e-6). Each cell costs two launches (~30-60 s each on 2 cores).
--chain costs one launch a cell and one more: each cell's fault goes into the launch that
resumes the cell before it, in one run directory, whose losses at the end are every cell's.
--two-nodes (root only) runs each launch as two nodes, one worker each, in two network
namespaces (scripts/two_hosts.py): node 0 holds rank 0 and the scheduler, node 1 rank 1; a
signal "to launch.sh" goes to node 0's, each node runs the command its own launch printed,
and a row gives each node's exit and seconds to exit as "node 0 / node 1". Its default cells
are a stop, the kill of the other node's worker and a kill during the save; the reference is
an uninterrupted launch on one host.
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

import two_hosts  # scripts/two_hosts.py, beside this script

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "recipes" / "cpu_smoke.yaml"
STEPS, SAVE_EVERY = 8, 3
ARGS = ["--set", "data.max_seq_len=32", "--set", "train.micro_batch_size=2", "--set", "train.global_batch_size=0",
        "--set", "train.warmup_steps=2", "--set", "data.eval_files=[]", "--set", f"train.max_steps={STEPS}",
        "--set", f"train.save_every={SAVE_EVERY}", "--set", "train.keep_last=3"]
FAULTS = ("sigint_launch", "sigterm_launch", "sigterm_worker", "sigkill_worker", "disk_full", "sigkill_rank1")
MOMENTS = ("compile", "mid_step", "mid_save")
SINGLE_HOST_CELLS = [f"{f}:{m}" for f in FAULTS[:5] for m in MOMENTS]
TWO_NODE_CELLS = ["sigterm_launch:mid_step", "sigkill_rank1:mid_step", "sigkill_worker:mid_save"]
NODES: list = []  # --two-nodes: [(namespace, address)] of node 0 and node 1; empty: one host
SAVED_MID_RUN = 2 * SAVE_EVERY  # the step whose save `mid_save` hits


@dataclass
class Cell:
    fault: str
    moment: str
    exit_status: Optional[int] = None  # node 0's under --two-nodes; node 1's in `nodes`
    seconds_to_exit: Optional[float] = None
    last_line: str = ""
    nodes: Optional[list] = None  # --two-nodes: [{exit_status, seconds_to_exit, last_line}] of node 0 and node 1
    ranks_stopped_at: tuple = ()  # the step each rank's "stopped by ... after step N" names
    resumed_from: Optional[int] = None
    steps_lost: Optional[int] = None
    exact: Optional[bool] = None
    note: str = ""


def _port() -> str:
    return str(random.randint(20000, 40000))


def node_logs(logs: Path, node: int) -> Path:
    """Where node `node`'s launch writes its console (stdout, stderr) and its LOG_DIR (msrun/)."""
    return logs / f"node{node}" if NODES else logs


def worker_log(logs: Path, rank: int) -> Path:
    return node_logs(logs, rank if NODES else 0) / "msrun" / f"worker_{rank}.log"  # one worker a node


def launch(commands: list, logs: Path) -> list:
    """Each (environment, words) of `commands` as a launch: one on this host, or one a node of
    NODES in its namespace, all with the same MASTER_PORT. The processes, node 0's first."""
    port = next((env["MASTER_PORT"] for env, _ in commands if "MASTER_PORT" in env), _port())
    started = []
    for node, (env, words) in enumerate(commands):
        out = node_logs(logs, node)
        out.mkdir(parents=True, exist_ok=True)
        node_env = two_hosts.node_env(NODES, node, port) if len(commands) > 1 else {}
        env = {**os.environ, **node_env, "LOG_DIR": str(out / "msrun"), **env, "MASTER_PORT": port}
        command = ["bash", *map(str, words)]
        started.append(subprocess.Popen(two_hosts.in_node(NODES, node, command) if len(commands) > 1 else command,
                                        cwd=REPO, env=env, start_new_session=True, preexec_fn=default_sigint,
                                        stdout=open(out / "stdout", "w"), stderr=open(out / "stderr", "w")))
    return started


def default_sigint() -> None:
    """In a launch: SIGINT as a terminal delivers it. This script run in the background
    (`nohup ... &`) inherits SIGINT ignored, and bash cannot trap a signal ignored on entry, so
    launch.sh would never see the sigint_launch cells' Ctrl-C (they then simply finished)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_all(procs: list, timeout: float) -> list:
    """The exit statuses of `procs`, and the seconds each took from now: [(status, seconds)]."""
    start, ended = time.monotonic(), {}
    while len(ended) < len(procs):
        for i, proc in enumerate(procs):
            if i not in ended and proc.poll() is not None:
                ended[i] = (proc.returncode, round(time.monotonic() - start, 1))
        if time.monotonic() - start > timeout:
            raise RuntimeError(f"the launch did not end within {timeout} s")
        time.sleep(0.05)
    return [ended[i] for i in range(len(procs))]


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


def wait_for(condition, procs: list, what: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if any(proc.poll() is not None for proc in procs):
            raise RuntimeError(f"the launch ended (exit {[proc.poll() for proc in procs]}) before {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.01)


def wait_for_moment(moment: str, procs: list, out: Path, logs: Path, before: Before) -> None:
    if moment == "compile":  # both ranks are in the first step, compiling its graph
        wait_for(lambda: all("the first step compiles" in _read(worker_log(logs, r)) for r in (0, 1))
                 and not metric_steps(out, before), procs, "the first step")
    elif moment == "mid_step":
        wait_for(lambda: len(metric_steps(out, before)) >= SAVE_EVERY + 1, procs, f"step {SAVE_EVERY + 1}")
    else:  # the hidden staging directory of step 6's checkpoint exists: its files are being written
        wait_for(lambda: bool(partial_saves(out) - before.partial_saves), procs, f"the save of step {SAVED_MID_RUN}")


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def inject(fault: str, proc, port: str) -> None:
    """The fault; a signal to launch.sh goes to `proc`, node 0's."""
    if fault == "sigint_launch":
        proc.send_signal(signal.SIGINT)
    elif fault == "sigterm_launch":
        proc.send_signal(signal.SIGTERM)
    else:
        rank = 1 if fault in ("sigterm_worker", "sigkill_rank1") else 0
        pid = worker_pid(port, rank)
        if pid is None:
            raise RuntimeError(f"rank {rank}'s worker not found")
        if fault == "disk_full":  # every file rank 0 writes from now on is capped at 16 MiB; model.ckpt needs 33
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
        else:
            os.kill(pid, signal.SIGTERM if fault == "sigterm_worker" else signal.SIGKILL)


def continue_command(stderr: str) -> tuple[dict, list]:
    """(environment, words) of the `continue with:` line launch.sh printed last (a node's own)."""
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
    """The launch of a cell, the same on every node: [(environment, words)] a node."""
    return [({}, ["scripts/launch.sh", SMOKE, 2, "--output-dir", out, *ARGS])] * (len(NODES) or 1)


def what_it_said(stderr: str) -> str:
    """A launch's last line before its `continue with:` command."""
    said = [line for line in stderr.splitlines() if not line.startswith("launch: continue with: ")]
    return said[-1].split("; continue with: ")[0] if said else ""


def fault_launch(cell: Cell, commands: list, out: Path, logs: Path) -> tuple[list, int]:
    """Start `commands` (one a node), inject the cell's fault at its moment and note how each
    node's launch ended: (each node's stderr, the last step logged)."""
    before, port = Before.of(out), _port()
    procs = launch([(({**env, "MASTER_PORT": port}), words) for env, words in commands], logs)
    # The disk fills before step 6's save starts, not during it: set the limit after step 4.
    wait_for_moment("mid_step" if cell.fault == "disk_full" else cell.moment, procs, out, logs, before)
    inject(cell.fault, procs[0], port)
    ended = wait_all(procs, timeout=600)
    stderrs = [_read(node_logs(logs, node) / "stderr") for node in range(len(procs))]
    (cell.exit_status, cell.seconds_to_exit), cell.last_line = ended[0], what_it_said(stderrs[0])
    if NODES:
        cell.nodes = [{"exit_status": status, "seconds_to_exit": seconds, "last_line": what_it_said(stderr)}
                      for (status, seconds), stderr in zip(ended, stderrs)]
    cell.ranks_stopped_at = tuple(int(m.group(1)) for r in (0, 1) if (m := re.search(
        r"stopped by [\w ]+? after step (\d+)", _read(worker_log(logs, r)))))
    return stderrs, max(metric_steps(out), default=0)


def stop(cell: Cell, commands: list, out: Path, work: Path, reference: dict, earlier=()) -> Optional[tuple]:
    """The cell's fault in the launch of `commands`: (cell, each node's stderr, steps logged) if it
    stopped the launch; if the launch finished instead, its losses are the cell's and the
    `earlier` cells'."""
    try:
        stderrs, trained = fault_launch(cell, commands, out, work / "logs")
    except RuntimeError as exc:
        cell.note = f"not run: {exc}"
        return None
    if cell.exit_status or any(node["exit_status"] for node in cell.nodes or ()):
        return cell, stderrs, trained
    cell.steps_lost, cell.note = 0, "finished: the stop request reached the last step"
    for done in (cell, *earlier):
        done.exact = same_losses(out, reference)
    return None


def resumed(stopped: tuple, logs: Path) -> None:
    """The step the launch logging under `logs` resumed a stopped launch, (cell, stderr, steps
    logged), from."""
    cell, _, trained = stopped
    marker = next((line for line in _read(worker_log(logs, 0)).splitlines() if "resumed from" in line), "")
    cell.resumed_from = int(marker.rsplit(" ", 1)[1]) if marker else 0
    cell.steps_lost = trained - cell.resumed_from


def finish(stopped: list, out: Path, work: Path, reference: dict) -> None:
    """Run the command the last of the `stopped` launches printed (on each node, its own) to the
    end: each one's losses are then the run directory's."""
    logs, port = work / "resumed", _port()  # a fresh port: the last launch's may linger in TIME_WAIT
    commands = [continue_command(stderr) for stderr in stopped[-1][1]]
    statuses = wait_all(launch([({**env, "MASTER_PORT": port}, words) for env, words in commands], logs), 900)
    if any(status for status, _ in statuses):
        last = [_read(node_logs(logs, node) / "stderr").strip().splitlines()[-1:] for node in range(len(commands))]
        stopped[-1][0].note = f"the resumed launch failed: {last}"
        return
    resumed(stopped[-1], logs)
    for cell, _, _ in stopped:
        cell.exact = same_losses(out, reference)


def run_cell(cell: Cell, reference: dict, work: Path) -> None:
    """The cell on a launch of its own, then the command it printed."""
    out = work / "run"
    stopped = stop(cell, fresh_launch(out), out, work, reference)
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
        commands = [continue_command(chained[-1][1][0])] if chained else fresh_launch(out)
        stopped = stop(cell, commands, out, cell_work, reference, [c for c, _, _ in chained])
        if chained:
            resumed(chained[-1], cell_work / "logs")
        chained = [*chained, stopped] if stopped else None
    if chained:
        finish(chained, out, cell_work, reference)


def reference_run(work: Path) -> dict:
    out, logs = work / "run", work / "logs"
    (proc,) = launch(fresh_launch(out)[:1], logs)  # on one host, also for --two-nodes
    if proc.wait(timeout=900) != 0:
        raise RuntimeError(f"the uninterrupted launch failed: {_read(logs / 'stderr')[-2000:]}")
    return losses(out)


def table(cells) -> str:
    rows = [("fault", "moment", "exit", "s to exit", "resumed from", "steps lost", "exact", "last line / note")]
    for c in cells:
        nodes = c.nodes or [{"exit_status": c.exit_status, "seconds_to_exit": c.seconds_to_exit,
                             "last_line": c.last_line}]
        each = [" / ".join("" if n[key] is None else str(n[key]) for n in nodes) for key in ("exit_status",
                                                                                          "seconds_to_exit")]
        said = " / ".join(n["last_line"][:110] for n in nodes)
        rows.append((c.fault, c.moment, *each, *("" if v is None else str(v) for v in (c.resumed_from, c.steps_lost)),
                     {True: "yes", False: "NO", None: ""}[c.exact], c.note or said))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)) + "  " + r[-1] for r in rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", nargs="+", metavar="FAULT:MOMENT",
                        help=f"default: {' '.join(SINGLE_HOST_CELLS)}; with --two-nodes: {' '.join(TWO_NODE_CELLS)}")
    parser.add_argument("--json", type=Path, help="also write the cells as JSON here")
    parser.add_argument("--work", type=Path, help="keep every launch's directory here (default: a temporary one)")
    parser.add_argument("--chain", action="store_true",
                        help="inject each cell's fault into the launch resuming the cell before it")
    parser.add_argument("--two-nodes", action="store_true",
                        help="run each launch as two nodes in two network namespaces (root only)")
    parser.add_argument("--reference", type=Path, metavar="RUN_DIR",
                        help="an uninterrupted launch of the same arguments to compare with (default: run one)")
    args = parser.parse_args(argv)
    if args.two_nodes and (args.chain or two_hosts.why_not()):
        parser.error(f"--two-nodes: {two_hosts.why_not() or 'not with --chain'}")
    cells_asked = [tuple(c.split(":", 1)) for c in args.cells or (TWO_NODE_CELLS if args.two_nodes else
                                                                   SINGLE_HOST_CELLS)]
    for fault, moment in cells_asked:
        if fault not in FAULTS or moment not in MOMENTS:
            parser.error(f"--cells {fault}:{moment}: expected FAULT:MOMENT with FAULT in {', '.join(FAULTS)} and "
                         f"MOMENT in {', '.join(MOMENTS)}")
    work = args.work or Path(tempfile.mkdtemp(prefix="fault-matrix-"))
    reference = losses(args.reference) if args.reference else reference_run(work / "reference")
    try:
        if args.two_nodes:
            two_hosts.remove_leftovers()  # what a killed run of this script or the tests left
            NODES.extend(two_hosts.make_nodes())
        run_cells(cells_asked, args.chain, reference, work)
    finally:
        if args.two_nodes:
            two_hosts.remove_leftovers()
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in CELLS], indent=1))
    return 0


CELLS: list = []  # the cells run, for --json


def run_cells(cells_asked: list, chain: bool, reference: dict, work: Path) -> None:
    cells = [Cell(fault, moment) for fault, moment in cells_asked]
    CELLS.extend(cells)
    if chain:
        run_chain([c for c in cells if not not_applicable(c)], reference, work)
    for cell in [] if chain else cells:
        if not not_applicable(cell):
            run_cell(cell, reference, work / f"{cell.fault}-{cell.moment}")
        print(table([cell]).splitlines()[-1], file=sys.stderr, flush=True)
    print(table(cells))


if __name__ == "__main__":
    sys.exit(main())
