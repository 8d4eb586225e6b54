"""training/run.py's door to the run's length (recipe/run_length.py) and the resumed schedule's
(recipe/resume_checks.py), kept only until run.py, which another change is editing, imports them
from there: then this file goes."""
from __future__ import annotations

from ..recipe.resume_checks import schedule_steps  # noqa: F401  (re-exported for run.py)
from ..recipe.run_length import with_steps  # noqa: F401  (re-exported for run.py)
