"""A training run: `run_training` checks everything, reads the data and opens the run
directory, then builds the run (training/session.py) and trains it (training/loop.py);
`format_summary` is what `train` prints at the end.

Strategy logic lives in llama_npu/strategies and the checkpoint policy in checkpoints/policy.py;
these modules only wire the pieces together and run them in order, so the loop reads in one
sitting.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Optional

import yaml

from ..checkpoints.files import read_state
from ..checkpoints.leftovers import repair_killed_saves
from ..common.frameworks import quiet_frameworks
from ..common.launcher import launched_rank, launched_workers
from ..common.stopping import StopSignals
from ..objectives import of as objective_of, run_samples
from ..recipe.resume_checks import schedule_steps
from ..recipe.run_length import with_steps
from ..recipe.schema import Recipe, with_absolute_paths
from ..recipe.stored import STORED_RECIPE, stored_recipe
from .data_size import warn_data_size
from .preflight import checked_start
from .runtime import init_runtime


def open_run_dir(run_dir: Path, recipe: Recipe, overwrite: bool) -> bool:
    """The point of no return, reached only once every check passed: clear the directory
    (--overwrite), create it and store the recipe. A resumed run keeps the recipe.yaml it
    was started with; its paths are stored absolute. Returns whether this run created the directory, so that a start-up
    failure after this point can remove it again."""
    if overwrite and run_dir.exists():
        shutil.rmtree(run_dir)
    created = not run_dir.is_dir() or not any(run_dir.iterdir())
    run_dir.mkdir(parents=True, exist_ok=True)
    stored = run_dir / STORED_RECIPE
    if not stored.exists():
        stored.write_text(yaml.safe_dump(with_absolute_paths(recipe).to_dict(), sort_keys=False, allow_unicode=True),
                          encoding="utf-8")
    return created


def started_with(run_dir: Path, candidates: Optional[list], rows: int) -> Optional[int]:
    """The length of the lr schedule the resumed run had: its newest checkpoint's, else (a
    checkpoint older than the key) its recipe.yaml's train.max_steps, or its epochs over `rows`;
    None when no checkpoint is resumed."""
    if not candidates:
        return None
    state = read_state(candidates[0]) or {}
    if "schedule_steps" in state:
        return state["schedule_steps"]
    stored = stored_recipe(run_dir)
    return with_steps(stored, rows).train.max_steps if stored is not None else None


def first_example(recipe: Recipe, train_source) -> str:
    """The first training example decoded, its scored tokens marked (data/example.py)."""
    from ..data.example import describe_first_example  # imported here: with the tokenizers library, after the checks
    from ..data.tokenizer import load_tokenizer

    return describe_first_example(train_source, load_tokenizer(recipe.data.tokenizer))


def run_training(recipe: Recipe, run_dir: Path, signals: StopSignals, resume: Optional[str] = None,
                 overwrite: bool = False, force: bool = False, rehearsal: Optional[dict] = None) -> dict:
    """Check everything, then train. Nothing is written, deleted (--overwrite) or built
    before every pre-flight check and the tokenizing have passed; a start-up that fails or is
    interrupted (stopping.StopSignals) after that removes the run directory it created."""
    run_dir, rank = Path(run_dir), launched_rank()
    if resume == "auto":  # before the checkpoints are listed: what killed saves left (every rank alike)
        repair_killed_saves(run_dir)
    resume_candidates, warn_recipe_hash = checked_start(recipe, run_dir, resume, overwrite, force,
                                                        launched_workers(), rank == 0, rehearsal is not None)
    train_source, eval_samples = run_samples(recipe)
    if rehearsal is not None:  # DPO: a reference pass as short as it
        train_source = objective_of(recipe).rehearsal_source(train_source, recipe)
    if rank == 0:
        print(first_example(recipe, train_source), flush=True)
    counted = with_steps(recipe, len(train_source), say=rank == 0)  # train.epochs as steps
    if rehearsal is None and rank == 0:  # a rehearsal's few short steps say nothing of the recipe's schedule
        warn_data_size(counted, len(train_source))
    # Under msrun only rank 0 clears and writes the run directory; the others read.
    with signals.creating_run_dir():
        created = open_run_dir(run_dir, recipe, overwrite) if rank == 0 else False
        if created:
            signals.remove_on_startup_signal(run_dir)
    try:
        quiet_frameworks(run_dir / "logs" if rank == 0 else
                         Path(tempfile.gettempdir()) / "llama-npu-logs" / run_dir.name / f"rank_{rank}")
        on_ascend = init_runtime(recipe)
        # imported here: they import MindSpore, whose log settings quiet_frameworks has just made
        from .loop import run_loop
        from .session import setup

        schedule = schedule_steps(counted.train, started_with(run_dir, resume_candidates, len(train_source)),
                                  say=rank == 0)
        session = setup(counted, run_dir, train_source, eval_samples, on_ascend, resume_candidates,
                        warn_recipe_hash, rehearsal, schedule)
        return run_loop(session, signals)
    except BaseException:
        if created and not signals.training_started:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def format_summary(summary: dict) -> str:
    where = {"device": "NPU device memory (mindspore.runtime)",
             "host_rss": "host peak RSS; CPU memory is no proxy for NPU memory"}[summary["memory_source"]]
    rate = summary["tokens_per_s"]
    lines = [
        f"steps          {summary['steps']} ({summary['steps_this_run']} in this run)",
        f"loss           {summary['first_loss']:.4f} (first) -> {summary['last_loss']:.4f} (last)"
        if summary["first_loss"] is not None else "loss           (no step ran)",
        f"tokens/s       {rate:,.0f} (excluding the compiling first step)" if rate else
        "tokens/s       n/a (too few steps to time)",
        f"peak memory    {summary['peak_memory_bytes'] / 2**30:.2f} GiB, {where}",
        f"checkpoint     {summary['checkpoint'] or ('rank 0 saves it' if summary.get('rank') else None)}",
    ]
    if summary.get("loss_sparkline"):  # the curve's shape in the console and any log, no file to open
        first = summary["steps"] - summary["steps_this_run"] + 1
        lines.insert(2, f"loss curve     {summary['loss_sparkline']} (steps {first}-{summary['steps']})")
    if "eval_loss" in summary:
        lines.insert(2, f"held-out loss  {summary['eval_loss']:.4f} over {summary['eval_tokens']} target tokens")
    if "rehearsal" in summary:
        lines += [f"rehearsal      on the CPU; shrunk: {'; '.join(summary['rehearsal']['shrunk'])}"]
        lines += [f"not rehearsed  {item}" for item in summary["rehearsal"]["not_rehearsed"]]
    return "\n".join(lines)
