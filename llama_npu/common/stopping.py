"""Ending a run without losing work: on a signal, after a streak of non-finite steps
(training/nonfinite.py), or when a checkpoint cannot be written.

- `StopSignals`: during training the first SIGTERM/SIGINT only sets a flag; the loop
  finishes the current optimizer step, writes a checkpoint and exits with PREEMPTED. A
  second signal ends the process at once. During start-up the first signal ends it,
  removing the run directory the start-up created. Checkpoints are written
  under a temporary name and renamed (common/atomic.py), so dying mid-save leaves the previous
  complete checkpoint as it was.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

# sysexits.h EX_TEMPFAIL: "temporary failure, the user is invited to retry" -- here, to rerun
# with --resume auto. Distinct from 1 (failure) and from 128+N (killed by signal N).
PREEMPTED = 75


class RunFailure(RuntimeError):
    """The run cannot go on; the message says why and what the last good checkpoint is."""


class StopSignals:
    """SIGTERM and SIGINT for the whole `train` command, taken by one watcher thread.

    Why not signal.signal: every MindSpore graph run installs its own SIGINT handler, which
    re-sends the signal to the process as SIGTERM (SignalGuard / DefaultIntHandler in
    MindSpore's C++ signal_util.cc; seen with 2.9.0 on CPU), so a Python handler sees Ctrl-C
    as SIGTERM. Blocked in the main thread before any other thread exists (threads inherit the
    mask, so MindSpore's and the tokenizer's never run a handler), both signals wait for
    sigwaitinfo here and arrive with their real number.

    During start-up the first signal ends the process at once, with one line and exit 128 + N,
    after removing the run directory if this run created it (`remove_on_startup_signal`); no
    exception is raised into the main thread, which may be deep in MindSpore's C++ or in an
    import. Once `training()` is entered the first signal only sets `received`: the loop
    finishes its step and saves. A second signal exits at once with 128 + its number.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.received: Optional[str] = None
        self.training_started = False
        self._lock = threading.Lock()  # held by the main thread while it creates the run directory
        self._created: Optional[Path] = None

    def start(self) -> "StopSignals":
        """Call first in the process, before MindSpore or the tokenizer start threads."""
        signal.pthread_sigmask(signal.SIG_BLOCK, self.SIGNALS)
        threading.Thread(target=self._watch, name="llama-npu-signals", daemon=True).start()
        return self

    def _watch(self) -> None:
        while True:
            number = signal.sigwaitinfo(self.SIGNALS).si_signo
            if self.received is not None:
                os._exit(128 + number)
            self.received = signal.Signals(number).name
            with self._lock:
                if not self.training_started:
                    self._end_startup(number)
            print(f"\n[llama-npu] {self.received} received: finishing this step and saving a checkpoint "
                  f"(send it again to exit at once; the last complete checkpoint stays intact)", flush=True)

    def _end_startup(self, number: int) -> None:
        if self._created is not None:
            shutil.rmtree(self._created, ignore_errors=True)
        # On a line of its own: a progress bar (tokenizing, the reference pass) may be drawn there.
        print(f"\nllama-npu: error: {self.received} received during start-up, before the first step; nothing "
              f"of this run was kept", file=sys.stderr, flush=True)
        os._exit(128 + number)

    @contextmanager
    def creating_run_dir(self):
        """A start-up signal waits while the run directory is being created, so that what
        it removes is all there is."""
        with self._lock:
            yield

    def remove_on_startup_signal(self, run_dir: Path) -> None:
        self._created = run_dir

    @contextmanager
    def training(self):
        """From here on a signal stops the loop after the current step."""
        with self._lock:
            self.training_started = True
        yield self
