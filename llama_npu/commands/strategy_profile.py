"""`llama-npu profile`: the recipe trained under each strategy combination, and measured
(profiling/strategy_profile.py)."""
from __future__ import annotations

from pathlib import Path

from ..profiling.strategy_profile import format_result, run_profile


def add_parser(subparsers) -> None:
    prof = subparsers.add_parser("profile", help="train the recipe under each strategy combination and measure it")
    prof.add_argument("recipe", help="recipe YAML file")
    prof.add_argument("--combos", metavar="SPEC",
                      help="axes and values, e.g. 'precision=O0,O2;accumulation=1,4;recompute=off,on;"
                           "chunked_ce=off,on;lora=off,on' (the default matrix) or any recipe key, e.g. "
                           "'train.micro_batch_size=1,2,4'")
    prof.add_argument("--steps", type=int, default=5, help="timed steps after the compiling first (default 5)")
    prof.add_argument("--out", metavar="DIR", help="output directory (default: runs/<recipe name>-profile)")
    prof.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a recipe key in every combination (repeatable)")
    prof.set_defaults(func=run)


def run(args) -> int:
    recipe = Path(args.recipe)
    out = Path(args.out or Path("runs") / f"{recipe.stem}-profile")
    profile = run_profile(recipe, args.combos, args.steps, out, args.set)
    print(format_result(profile, out))
    return 0
