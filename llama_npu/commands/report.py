"""`llama-npu report RUN [RUN ...] [-o FILE.html]`: one self-contained HTML page comparing runs,
and the comparison as a text table (report/page.py)."""
from __future__ import annotations

import sys
from pathlib import Path

from .arguments import BAD_INPUT


def add_parser(subparsers) -> None:
    report = subparsers.add_parser(
        "report", help="one self-contained HTML page comparing runs (curves, recipes, plan, checkpoints)",
        description="Read run directories (nothing in them changes) and write one HTML file with every picture "
                    "inline: no server, no script, nothing fetched. Also prints the comparison as a table. Exit 2 "
                    "on a directory that is not a run, a run with no metrics yet, or runs of different objectives.")
    report.add_argument("runs", nargs="+", metavar="RUN", help="run directories (train's --output-dir)")
    report.add_argument("-o", "--output", default="llama-npu-report.html", metavar="FILE.html",
                        help="the page to write (replaced if it exists)")
    report.set_defaults(func=run)


def run(args) -> int:
    from ..common.atomic import check_writable
    from ..report.page import write_report
    from ..report.series import RunReadError
    from .plan import json_arguments

    check_writable(Path(args.output), "--output")
    try:
        print(write_report([Path(p) for p in args.runs], Path(args.output), json_arguments))
    except RunReadError as exc:
        print(f"llama-npu: error: {exc}", file=sys.stderr)
        return BAD_INPUT
    return 0
