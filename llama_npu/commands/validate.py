"""`llama-npu validate`: train's pre-flight checks, every problem listed, without training."""
from __future__ import annotations

import sys

from ..strategies.parallel import describe_layout
from .arguments import BAD_INPUT, add_run_arguments


def add_parser(subparsers) -> None:
    check = subparsers.add_parser("validate",
                                  help="run train's pre-flight checks and list every problem, without training")
    add_run_arguments(check)
    check.add_argument("--workers", type=int, help="processes it will be launched on (default: 1, as a plain "
                                                   "`llama-npu train`)")
    check.add_argument("--rank", type=int, default=0, help="check as this rank does: only rank 0 judges the "
                                                           "output directory (scripts/launch.sh on nodes after 0)")
    check.add_argument("--strict-device", action="store_true",
                       help="fail (exit 2) when this host lacks the recipe's device; by default everything else is "
                            "checked, at the recipe's layout, and the device check is left for a host with it")
    check.set_defaults(func=run)


def run(args) -> int:
    # imported here: they load numpy, which --help does not need
    from ..training.absent_device import validate_problems
    from ..training.data_size import check_data_size

    problems, recipe, run_dir, rehearsal, left = validate_problems(args)
    for problem in problems:
        print(f"llama-npu: error: {problem}", file=sys.stderr)
    if problems:
        if left:
            print(f"llama-npu: {left}", file=sys.stderr)
        return BAD_INPUT
    if not rehearsal:  # a rehearsal's few short steps say nothing of the recipe's schedule
        check_data_size(recipe)
    print(f"{args.recipe or run_dir / 'recipe.yaml'}: valid{' as a rehearsal' if rehearsal else ''}; "
          f"{describe_layout(recipe)}")
    if left:
        print(f"llama-npu: {left}")
    return 0
