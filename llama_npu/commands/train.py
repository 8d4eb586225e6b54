"""`llama-npu train`: fine-tune from a YAML recipe (training/request.py says what the command
line asks for and runs it)."""
from __future__ import annotations

import sys

from ..common.launcher import is_scheduler
from ..common.stopping import PREEMPTED, StopSignals
from ..strategies.parallel import run_scheduler
from .arguments import add_run_arguments


def add_parser(subparsers) -> None:
    train = subparsers.add_parser("train", help="fine-tune from a YAML recipe")
    add_run_arguments(train)
    train.add_argument("--print-example", action="store_true",
                       help="print the first training example decoded, the tokens the loss scores marked, and exit "
                            "without training (every run prints it at its start)")
    train.set_defaults(func=run)


def run(args) -> int:
    if is_scheduler():  # msrun runs the command as its scheduler too
        run_scheduler()
        return 0
    signals = StopSignals().start()  # before anything starts a thread: see StopSignals
    # imported here, after the signals: they load numpy, which --help does not need
    from ..training.request import train_request
    from ..training.run import format_summary

    if args.print_example:
        from ..training.request import print_example

        print(print_example(args))
        return 0
    summary, stopped = train_request(args, signals)
    print(format_summary(summary))
    if stopped:
        print(f"llama-npu: {stopped}", file=sys.stderr)
        return PREEMPTED
    return 0
