"""What a save killed outright (SIGKILL, a second signal, the OOM killer) leaves behind,
cleared when the next run starts, before it chooses the step to resume.

common/atomic.staged_directory writes step_<N> as a hidden `.step_<N>.partial-PID` and, when
step_<N> is saved again after a resume, first renames the old copy to `.step_<N>.old-PID`.
A kill can leave:
  - `.step_<N>.partial-PID`: a save cut off; never a checkpoint, removed;
  - `.step_<N>.old-PID` with no step_<N>: cut off between the re-save's two renames; the old
    copy is the complete checkpoint it was, renamed back so the resume choice sees it;
  - `.step_<N>.old-PID` next to step_<N>: cut off while deleting the old copy; removed.
Only a PID that is no longer alive marks a leftover. Every rank repairs before it lists the
checkpoints; a rank that finds the work done by another (rename or removal lost to it) says
nothing, so each repair is one line and every rank sees the same step directories. The PID is
checked on this host only: the launch's own processes have saved nothing yet at start-up, so
a live one is another run writing the same directory, and an interrupted re-save it holds is
refused rather than guessed.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from ..common.console import note
from .files import CheckpointError, checkpoint_root, inspect, process_alive, rank_roots

_LEFTOVER = re.compile(r"^\.(step_\d+)\.(partial|old)-(\d+)$")


def _claimed(path: Path) -> bool:
    """Remove `path` once, whichever rank gets here first: renamed to this process's own
    name before deleting, so a rank that lost the race finds nothing and says nothing."""
    mine = path.with_name(f"{path.name}.removing-{os.getpid()}")
    try:
        os.rename(path, mine)
    except FileNotFoundError:
        return False
    shutil.rmtree(mine, ignore_errors=True)
    return True


def _refusal(root: Path, path: Path, name: str, kind: str, pid: int) -> None:
    """Raise when the leftover `path` cannot be repaired: a re-save still under way whose
    step is gone, or the old copy of a killed re-save that is itself not complete."""
    if kind != "old" or (root / name).exists():
        return
    if process_alive(pid) and pid != os.getpid():
        raise CheckpointError(f"resume: {name} is being re-saved by process {pid}, still alive ({path}); stop "
                              f"the run that writes {root} first")
    reason = inspect(path)[1]
    if reason is not None:
        raise CheckpointError(f"resume: {path} (the old copy of {name}, whose re-save was killed) is not complete "
                              f"({reason}) and {root / name} is missing; move it away to resume from an older step")


def _restore(root: Path, retired: Path, name: str, pid: int) -> None:
    """Rename the old copy of an interrupted re-save back to step_<N> (_refusal checked it)."""
    try:
        os.rename(retired, root / name)
    except FileNotFoundError:  # another rank restored it first
        return
    note(f"restored {root / name} from {retired.name}: a re-save of {name} by process {pid} was killed between its "
         f"two renames")


def _repair(root: Path, path: Path, name: str, kind: str, pid: int) -> None:
    if process_alive(pid) and pid != os.getpid():
        return  # a save still under way; not a leftover
    if kind == "old" and not (root / name).exists():
        _restore(root, path, name, pid)
    elif _claimed(path):
        what = "a save" if kind == "partial" else "the old copy left by a re-save"
        note(f"removed {path}: {what} of {name} by process {pid}, killed before it finished")


def repair_killed_saves(run_dir: Path) -> None:
    """Clear what killed saves left under every checkpoint root of `run_dir` (see above).
    Every leftover is judged before any is touched, so a refusal leaves the run as it was."""
    found = [(root, path, match) for root in [checkpoint_root(run_dir), *rank_roots(run_dir)] if root.is_dir()
             for path in sorted(root.iterdir()) if (match := _LEFTOVER.match(path.name))]
    for repair in (_refusal, _repair):
        for root, path, match in found:
            repair(root, path, match.group(1), match.group(2), int(match.group(3)))
