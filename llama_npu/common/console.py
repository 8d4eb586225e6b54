"""What the user sees while a command runs: a bar with the estimated time left (stderr),
one line when a slow phase starts (stdout: loading, tokenizing, compiling, writing), and
warnings (stderr; printed, not `warnings.warn`, which MindSpore's imports can silence)."""
from __future__ import annotations

import sys


def progress_bar(total: int, desc: str, unit: str, initial: int = 0, enabled: bool = True):
    """A tqdm bar: count, rate and time left ("[elapsed<remaining]")."""
    from tqdm import tqdm  # imported here: --help imports this module; tqdm, only to draw a bar

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
                disable=not enabled)


def note(message: str) -> None:
    print(f"[llama-npu] {message}", flush=True)


def warn(message: str) -> None:
    line = f"[llama-npu] warning: {message}"
    if "tqdm" in sys.modules:  # a bar may be drawn on the current line: tqdm.write puts the warning on its own
        sys.modules["tqdm"].tqdm.write(line, file=sys.stderr)
        sys.stderr.flush()
    else:
        print(line, file=sys.stderr, flush=True)


def tracked_items(mapping: dict, desc: str, unit: str = "tensor"):
    """mapping.items(), advancing a bar as they are consumed."""
    with progress_bar(len(mapping), desc, unit) as bar:
        for item in mapping.items():
            yield item
            bar.update(1)
