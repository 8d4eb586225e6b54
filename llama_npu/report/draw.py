"""`python -m llama_npu.report.draw RUN`: draw RUN/images/*.png in a process of its own, so that
training never waits on matplotlib (journal.py starts it). A failure is one line on stderr,
`pictures not drawn: ...`, and exit 1; never a traceback."""
from __future__ import annotations

import signal
import sys
from pathlib import Path


def main(argv) -> int:
    # train blocks these signals in every thread it starts (common/stopping.py) and a child
    # inherits the mask: unblocked, a signal to this child ends it like any other process.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, signal.SIGTERM))
    try:
        from .pictures import draw_run

        draw_run(Path(argv[0]))
    except Exception as exc:  # noqa: BLE001 -- whatever went wrong, training goes on: one line says it
        message = " ".join(str(exc).split())[:300]
        print(f"pictures not drawn: {type(exc).__name__}: {message}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
