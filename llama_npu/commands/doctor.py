"""`llama-npu doctor`: what this machine can train (selftest/doctor.py)."""
from __future__ import annotations

import sys
from pathlib import Path

from ..selftest.doctor import diagnose

SHIPPED_RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def add_parser(subparsers) -> None:
    doctor = subparsers.add_parser("doctor", help="what this machine can train")
    doctor.add_argument("--recipes", default=str(SHIPPED_RECIPES),
                        help="directory of recipes to judge (default: the shipped ones)")
    doctor.set_defaults(func=run)


def run(args) -> int:
    lines, code = diagnose(Path(args.recipes))
    print("\n".join(lines))
    if code:
        print("llama-npu: error: this environment cannot train (see above)", file=sys.stderr)
    return code
