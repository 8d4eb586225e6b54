"""What the run training in this process leaves for later eyes (rank 0 only): history.jsonl,
one line each time the run starts, resumes, stops, ends or fails (with its step and reason),
and RUN/images/*.png drawn in a child process after each checkpoint.

Drawing never stops a run nor holds up a step: the child (report/draw.py) draws while training
goes on; a checkpoint that comes while the last drawing still runs draws nothing (the next
will). At the end, a stop or a failure the run waits for one last drawing, so that the
pictures show the whole run when `train` returns. A drawing that fails is one warning line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

from ..common.console import warn
from .series import HISTORY

PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent  # the directory holding llama_npu/


class RunJournal:
    def __init__(self, run_dir: Path, writes: bool, draws: bool):
        """`writes`: this process keeps the run's records (rank 0); `draws`: train.plots."""
        self.path = Path(run_dir) / HISTORY
        self.run_dir = Path(run_dir)
        self.writes, self.draws = writes, writes and draws
        self.child: Optional[subprocess.Popen] = None
        self.warned: set = set()

    def record(self, event: str, step: int, **details) -> None:
        if not self.writes:
            return
        line = {"event": event, "step": step, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **details}
        mode = "w" if event == "start" else "a"  # a run started from step 0 has no history before it
        try:
            with open(self.path, mode, encoding="utf-8") as fh:
                fh.write(json.dumps(line, ensure_ascii=False) + "\n")
        except OSError as exc:  # the history is for looking back: the run goes on without it
            self._warn(f"could not write {self.path}: {exc.strerror}")

    def started(self, step: int, checkpoint: Optional[Path], discarded_steps: int) -> None:
        """A start from step 0, or a resume from `checkpoint` (steps after it that a killed
        run had logged are trained again: `discarded_steps` of them)."""
        if step == 0:
            self.record("start", 0)
        else:
            self.record("resume", step, checkpoint=str(checkpoint), discarded_steps=discarded_steps)

    def saved(self, step: int, last: bool, stopped_by: Optional[str]) -> None:
        """After the checkpoint of `step`: draw. `last`: the run ends here (stopped, or at
        train.max_steps), recorded before the last drawing so that it shows."""
        if last:
            self.record("stop" if stopped_by else "end", step, **({"reason": stopped_by} if stopped_by else {}))
        self.draw(wait=last)

    @contextmanager
    def failures(self, step):
        """A failure in the block (a non-finite streak, a checkpoint that cannot be written) is
        recorded at the step `step()` names, and drawn, before it goes on to end the run."""
        try:
            yield
        except Exception as exc:
            self.record("failed", step(), reason=" ".join(str(exc).split())[:300])
            self.draw(wait=True)
            raise

    def draw(self, wait: bool) -> None:
        if not self.draws:
            return
        if self._running():
            if not wait:
                return
            self._finish(self.child)
        env = {**os.environ, "MPLBACKEND": "Agg",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))}
        try:  # its own session: a Ctrl-C to train's terminal is train's to handle, not the drawing's
            self.child = subprocess.Popen([sys.executable, "-m", "llama_npu.report.draw", str(self.run_dir)],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
        except OSError as exc:
            self._warn(f"pictures not drawn: could not start the drawing process ({exc.strerror})")
            return
        if wait:
            self._finish(self.child)

    def _running(self) -> bool:
        if self.child is None:
            return False
        if self.child.poll() is None:
            return True
        self._finish(self.child)
        return False

    def _finish(self, child: subprocess.Popen) -> None:
        """Wait for `child`, and say once what it could not draw."""
        error = child.communicate()[1].strip()
        if child.returncode and error:
            self._warn(error.splitlines()[-1])
        self.child = None

    def _warn(self, message: str) -> None:
        if message not in self.warned:
            self.warned.add(message)
            warn(message)
