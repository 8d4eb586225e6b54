"""Gradient accumulation: train.global_batch_size samples an optimizer step, read as
micro-batches of train.micro_batch_size on each data-parallel rank; their gradients are
summed before one update (the step itself: steps/graph_step.py). A pipeline's micro-batches
are its accumulation.
"""
from __future__ import annotations

import math
from typing import List

from ..recipe.problems import RecipeError

KEY = "accumulation"
SECTION = None  # its keys are train.global_batch_size and train.micro_batch_size
CHECKED_AFTER = ("model", "sizes", "parallel")  # global / (micro x data) needs both valid
MAX_REHEARSED = 2  # micro-batches a rehearsal accumulates at most
PROFILE_EXPECTED = "a whole number of micro-batches >= 1"


def accumulation_steps(recipe) -> int:
    """Micro-batches per optimizer step: global / (micro x data parallel)."""
    t, par = recipe.train, recipe.strategies.parallel
    if t.global_batch_size == 0:
        return 1
    per_step = t.micro_batch_size * par.data
    if par.pipeline > 1:
        # The pipeline's micro-batches are its accumulation.
        if t.global_batch_size != per_step * par.micro_batches:
            raise RecipeError(
                f"train.global_batch_size={t.global_batch_size}: with pipeline stages it must equal "
                f"train.micro_batch_size={t.micro_batch_size} x strategies.parallel.data={par.data} x "
                f"strategies.parallel.micro_batches={par.micro_batches} = {per_step * par.micro_batches}")
        return 1
    if t.global_batch_size % per_step:
        raise RecipeError(
            f"train.global_batch_size={t.global_batch_size} is not divisible by "
            f"train.micro_batch_size={t.micro_batch_size} x data parallel {par.data} = {per_step}; "
            f"{dividing_values(t.global_batch_size, t.micro_batch_size, par.data)}")
    return t.global_batch_size // per_step


def dividing_values(global_batch: int, micro: int, data: int) -> str:
    """The settings nearest to the given ones that divide: the multiples of micro x data
    around the global batch, and the micro-batches whose x data divides it."""
    per_step = micro * data
    below, above = global_batch // per_step * per_step, (global_batch // per_step + 1) * per_step
    batches = " or ".join(f"train.global_batch_size={g}" for g in (below, above) if g > 0)
    micros = sorted(_divisors(global_batch // data) if global_batch % data == 0 else [],
                    key=lambda m: (abs(m - micro), m))[:2]
    return f"set {batches}" + (f", or {' or '.join(f'train.micro_batch_size={m}' for m in sorted(micros))}"
                               if micros else "")


def _divisors(n: int) -> list:
    """n's divisors, up to its square root and their partners: a mistyped global batch of
    1000000007 is refused at once rather than after a loop over every value below it."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def pipeline_micro_batches(section) -> int:
    """The micro-batches a pipeline (a ParallelSection) runs per step: its accumulation."""
    return section.micro_batches if section.pipeline > 1 else 1


def check(recipe) -> None:
    accumulation_steps(recipe)


def rehearse(r) -> None:
    """Accumulation rehearses over at most MAX_REHEARSED micro-batches of one sample per process."""
    # a pipeline's micro-batches are its accumulation (accumulation_steps is 1 there)
    steps = min(pipeline_micro_batches(r.recipe.strategies.parallel) * accumulation_steps(r.recipe), MAX_REHEARSED)
    r.change("train.global_batch_size", steps * r.workers if steps > 1 else 0,
             f"{steps} micro-batches accumulated per step" if steps > 1 else "")


def profile_value_ok(value: str) -> bool:
    return value.isdigit() and int(value) > 0


def profile_overrides(value: str, base) -> List[str]:
    """k micro-batches per optimizer step at the recipe's global batch, so that every value
    trains on the same samples per step and only the split differs."""
    k, data = int(value), base.strategies.parallel.data
    global_batch = base.train.global_batch_size or base.train.micro_batch_size * data
    if global_batch % (k * data):
        raise RecipeError(f"accumulation={k}: the global batch of {global_batch} samples does not split into "
                          f"{k} micro-batches x data parallel {data} (set train.global_batch_size)")
    return [f"train.micro_batch_size={global_batch // (k * data)}", f"train.global_batch_size={global_batch}"]


# ---------------------------------------------------------------- planner term

def step_rows(recipe) -> int:
    """Rows (samples, packed rows or an objective's items) one optimizer step takes over all
    data-parallel ranks: the global batch."""
    t = recipe.train
    return t.global_batch_size or t.micro_batch_size * recipe.strategies.parallel.data


def plan_settings(recipe) -> dict:
    return {"global_batch": step_rows(recipe)}


def accumulates(s) -> bool:
    """Whether gradients are summed over micro-batches (fp32 accumulators alive the whole step)."""
    return s.accumulation > 1 or s.pipeline > 1
