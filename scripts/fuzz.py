#!/usr/bin/env python3
"""Fuzz the readers of every input kind, outside pytest, and print per kind the cases tried,
refused, accepted, and the defects: tracebacks (any exception but the project's own error,
a MemoryError under the limit below included) and broken refusals (more than one line, or a
file changed). The goal is 0 in both columns.

    python scripts/fuzz.py --cases 2000 [--kind records] [--seed 0]
    python scripts/fuzz.py --kind readers --cases 20 [--reader eval ...] [--run RUN]

Each case runs in-process, below the CLI (tests/fuzz_inputs.py: the functions the commands
call), under an address-space limit of MEMORY_LIMIT: no input may make a reader allocate
beyond what a valid input of its size needs; and within CASE_SECONDS. tests/test_fuzz.py runs the same generators in
CI with fewer cases. Exit 1 when any defect was found; the first case of each distinct
defect is printed with its traceback.

`--kind readers` (tests/fuzz_readers.py; named, never run by default: a case costs about
a minute) damages a tiny run's newest step at random and runs every command that reads a
checkpoint on it (eval, generate, convert ms-to-hf, train --resume), given the step or the
run directory, each in its own process under its own memory and time limit, and prints per
reader the refusals, acceptances and steps passed over, and the tracebacks, hangs, memory
failures and damaged steps read silently. `--run` gives a finished six-step tiny run to damage
copies of (one is trained otherwise).
"""
from __future__ import annotations

import argparse
import atexit
import collections
import contextlib
import io
import os
import resource
import shutil
import signal
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
# hypothesis caches into ./.hypothesis even with database=None: not into the user's directory
if "HYPOTHESIS_STORAGE_DIRECTORY" not in os.environ:  # removed when the process ends: each run made one
    os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = tempfile.mkdtemp(prefix="llama-npu-hypothesis-")
    atexit.register(shutil.rmtree, os.environ["HYPOTHESIS_STORAGE_DIRECTORY"], True)

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from fuzz_inputs import KINDS, Defect, attempt  # noqa: E402
from fuzz_readers import COLUMNS as READER_COLUMNS, DEFECTS, READERS, fuzz_readers  # noqa: E402

# The process with its libraries loaded (pyarrow, openpyxl, the tokenizer, hypothesis) maps
# about 0.6 GB; every input is a few kB, so 2 GiB leaves room only for honest work.
MEMORY_LIMIT = 2 << 30
# A case is a few kB read in a fraction of a second; one still running after this is a hang
# (plan --fit --devices 10^9 searched for minutes), counted with the tracebacks.
CASE_SECONDS = 60


class Hang(Exception):
    pass


def _hang(signum, frame):
    raise Hang(f"still running after {CASE_SECONDS} s")
COLUMNS = ("tried", "refused", "accepted", "tracebacks", "broken")


def fuzz(kind: str, cases: int, start: int, shown: dict) -> collections.Counter:
    counts = collections.Counter()

    @settings(max_examples=cases, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @seed(start)
    @given(KINDS[kind].cases())
    def one(case):
        counts["tried"] += 1
        with tempfile.TemporaryDirectory() as work:
            signal.alarm(CASE_SECONDS)
            try:
                # a case's own notes (a column not read) are not the table
                with contextlib.redirect_stdout(io.StringIO()):
                    counts[attempt(kind, case, Path(work))] += 1
            except Exception as exc:  # noqa: BLE001 -- every other exception is what we count
                column = "broken" if isinstance(exc, Defect) else "tracebacks"
                counts[column] += 1
                where = traceback.extract_tb(exc.__traceback__)[-1]
                key = (kind, type(exc).__name__, where.filename, where.lineno)
                if key not in shown:
                    shown[key] = True
                    print(f"--- {kind}: {column[:-1]}: {repr(case)[:800]}\n{''.join(traceback.format_exception(exc))}",
                          file=sys.stderr)
            finally:
                signal.alarm(0)

    one()
    return counts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=200, help="cases per kind")
    parser.add_argument("--kind", choices=sorted([*KINDS, "readers"]), action="append",
                        help="only this kind (repeatable); readers only when named")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed: the same seed draws the same cases")
    parser.add_argument("--reader", choices=READERS, action="append", help="readers kind: only this command")
    parser.add_argument("--run", type=Path, help="readers kind: a finished six-step tiny run to damage copies of")
    args = parser.parse_args(argv)
    defects = 0
    if "readers" in (args.kind or []):
        defects += readers_table(args)
        args.kind.remove("readers")
        if not args.kind:
            return 1 if defects else 0
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, resource.getrlimit(resource.RLIMIT_AS)[1]))
    signal.signal(signal.SIGALRM, _hang)

    shown: dict = {}
    rows = {kind: fuzz(kind, args.cases, args.seed, shown) for kind in args.kind or KINDS}
    print(f"fuzz: {args.cases} cases per kind, seed {args.seed}, address space limited to "
          f"{MEMORY_LIMIT / (1 << 30):.0f} GiB")
    print(f"{'kind':<12}" + "".join(f"{c:>12}" for c in COLUMNS))
    for kind, counts in rows.items():
        print(f"{kind:<12}" + "".join(f"{counts[c]:>12}" for c in COLUMNS))
    defects += sum(counts["tracebacks"] + counts["broken"] for counts in rows.values())
    return 1 if defects else 0


def readers_table(args) -> int:
    """Run the readers kind, print its table; the number of defects."""
    rows = fuzz_readers(args.cases, args.seed, tuple(args.reader or READERS), args.run)
    print(f"fuzz readers: {args.cases} damaged steps, seed {args.seed}, each reader in its own process")
    print(f"{'reader':<10}" + "".join(f"{c:>12}" for c in READER_COLUMNS))
    for reader, counts in rows.items():
        print(f"{reader:<10}" + "".join(f"{counts[c]:>12}" for c in READER_COLUMNS))
    return sum(counts[c] for counts in rows.values() for c in DEFECTS)


if __name__ == "__main__":
    raise SystemExit(main())
