"""What a `train` or `validate` command line asks for: the recipe (a file, or a resumed run's
own recipe.yaml), the run directory and, with --rehearse, the rehearsal standing in for it;
then train's run or validate's list of problems."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..common.console import note
from ..common.launcher import launched_workers
from ..common.stopping import StopSignals
from ..objectives import run_samples
from ..recipe.load import load_recipe
from ..recipe.problems import RecipeError
from ..recipe.schema import Recipe
from ..recipe.stored import STORED_RECIPE, resumed_truncation, stored_recipe
from .preflight import PreflightError, check_output_dir, check_rehearsed_recipe, preflight, resume_command
from .rehearse import rehearse
from .run import first_example, run_training


def default_run_dir(args) -> Path:
    """--output-dir, else runs/<recipe name> (runs/<recipe name>-rehearsal with --rehearse)."""
    stem = Path(args.recipe).stem if args.recipe else ""
    return Path(args.output_dir or Path("runs") / (f"{stem}-rehearsal" if args.rehearse else stem))


def run_request(args):
    """(recipe, run dir, rehearsal report or None, problems found while getting them) of a
    `train` or `validate` command line. With --resume and --output-dir and no recipe file,
    the recipe is the run's own recipe.yaml."""
    workers = getattr(args, "workers", None)  # validate --workers; train runs on the ones launched
    workers = launched_workers() if workers is None else workers
    if args.recipe is None:
        if not (args.resume and args.output_dir):
            raise RecipeError(f"{args.command}: name a recipe file, or pass --resume and --output-dir to "
                              f"continue a run with its own {STORED_RECIPE}")
        recipe = stored_recipe(Path(args.output_dir), args.set)
        if recipe is None:
            raise RecipeError(f"--output-dir {args.output_dir} has no {STORED_RECIPE} to resume with; "
                              f"name the recipe file")
    else:  # validate --workers N resolves strategies.parallel.data=auto as msrun's N workers will
        recipe = load_recipe(args.recipe, args.set, workers=workers)
    run_dir = default_run_dir(args)
    if args.recipe is not None and args.resume:
        recipe = resumed_truncation(recipe, Path(args.recipe), args.set, run_dir)
    if not args.rehearse:
        return recipe, run_dir, None, []
    problems = check_rehearsed_recipe(recipe)
    rehearsal, shrunk, not_rehearsed = rehearse(recipe, workers)
    return rehearsal, run_dir, {"shrunk": shrunk, "not_rehearsed": not_rehearsed}, problems


def print_example(args) -> str:
    """`train --print-example`: the recipe's first training example, its scored tokens marked;
    nothing is checked beyond what reading the data needs, and nothing is written."""
    recipe = run_request(args)[0]
    return first_example(recipe, run_samples(recipe)[0])


def train_request(args, signals: StopSignals) -> tuple[dict, str]:
    """(summary, what to tell the user when a signal stopped the run, else "") of `train`."""
    recipe, run_dir, rehearsal, problems = run_request(args)
    if problems:
        raise PreflightError(problems)
    if rehearsal:
        note(f"rehearsal on the CPU: {'; '.join(rehearsal['shrunk'])}")
        for item in rehearsal["not_rehearsed"]:
            note(f"not rehearsed: {item}")
    summary = run_training(recipe, run_dir, signals, resume=args.resume, overwrite=args.overwrite,
                           force=args.force, rehearsal=rehearsal)
    if not summary["stopped_by"]:
        return summary, ""
    # Under msrun scripts/launch.sh prints the command that continues the whole launch.
    then = ("scripts/launch.sh prints the command that continues the launch" if "workers" in summary else
            f"continue with: {resume_command(run_dir, recipe)}")
    saved = f"newest checkpoint: {summary['checkpoint']}; " if summary["checkpoint"] else ""  # rank 0 saves
    return summary, f"stopped by {summary['stopped_by']} after step {summary['steps']}; {saved}{then}"


def request_problems(args) -> tuple[list, Optional[Recipe], Path, Optional[dict]]:
    """(every problem `train` would stop at, each once; recipe, run dir, rehearsal report) of a
    `validate` command line."""
    try:
        recipe, run_dir, rehearsal, problems = run_request(args)
    except RecipeError as exc:  # no recipe to check the rest against; the output directory still
        recipe, run_dir, rehearsal = None, default_run_dir(args), None
        problems = list(exc.problems) + check_output_dir(run_dir, args.resume, args.overwrite, args.rank == 0)[0]
    if recipe is not None:  # train's checks with train's defaults: its output directory, one process
        workers = args.workers if args.workers is not None else launched_workers()
        problems += preflight(recipe, run_dir, args.resume, args.overwrite, args.force, workers,
                              main_rank=args.rank == 0, rehearsal=rehearsal is not None)[0]
    return list(dict.fromkeys(problems)), recipe, run_dir, rehearsal  # a rehearsal checks the same files twice
