"""Whether the training data suits the schedule: a data set with fewer rows than one
optimizer step takes repeats rows within the step, and one read more than MAX_PASSES times
over train.max_steps is learnt by heart. Both are warnings with the numbers, from `train`
(once its data is tokenized and packed) and from `validate` (which tokenizes it the same way)."""
from __future__ import annotations

from ..common.console import warn

MAX_PASSES = 20


def step_rows(recipe) -> int:
    """Rows (samples or packed rows) one optimizer step takes over all data-parallel ranks."""
    t = recipe.train
    return t.global_batch_size or t.micro_batch_size * recipe.strategies.parallel.data


def data_size_warning(recipe, rows: int) -> str:
    """One line when `rows` training rows are too few for the recipe's schedule, else ""."""
    per_step, steps = step_rows(recipe), recipe.train.max_steps
    if rows < per_step:
        return (f"the training data gives {rows} rows, fewer than the {per_step} one optimizer step takes "
                f"(train.global_batch_size, or micro_batch_size x data parallel): every step repeats rows; add "
                f"data, or lower train.global_batch_size")
    passes = steps * per_step / rows
    if passes > MAX_PASSES:
        return (f"train.max_steps={steps} steps of {per_step} rows read the {rows} rows of the training data "
                f"{passes:,.0f} times (more than {MAX_PASSES} passes), which learns it by heart; lower "
                f"train.max_steps to about {MAX_PASSES * rows // per_step}, or add data")
    return ""


def warn_data_size(recipe, rows: int) -> None:
    line = data_size_warning(recipe, rows)
    if line:
        warn(line)


def check_data_size(recipe) -> None:
    """`validate`'s warning: the rows train would have, tokenized (and packed) as train does;
    under train.objective dpo the preference pairs, which the batch sizes count."""
    # imported here: tokenizing loads numpy, which the recipe checks before it do not need
    from ..data.source import run_samples

    warn_data_size(recipe, len(run_samples(recipe)[0]))
