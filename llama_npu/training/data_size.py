"""Whether the training data suits the schedule: a data set with fewer rows than one
optimizer step takes repeats rows within the step, and one read more than MAX_PASSES times
over train.max_steps is learnt by heart. Both are warnings with the numbers, from `train`
(once its data is tokenized and packed) and from `validate` (which tokenizes it the same way)."""
from __future__ import annotations

from ..common.console import warn
from ..objectives import run_samples
from ..recipe.run_length import MAX_PASSES, with_steps
from ..strategies.accumulation import step_rows


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
    an objective's items (DPO's pairs) where the batch sizes count those."""
    rows = len(run_samples(recipe)[0])
    warn_data_size(with_steps(recipe, rows, say=True), rows)
