"""What a bad recipe raises: RecipeError, its problem lines collected, and the two checks
most keys need (one of a set of values, a positive number)."""
from __future__ import annotations


class RecipeError(ValueError):
    """Recipe problems the user must fix, each a line naming the key and what was expected.
    The message is the first; `validate` prints every one of `problems`."""

    def __init__(self, problem):
        self.problems = list(problem) if isinstance(problem, list) else [str(problem)]
        more = len(self.problems) - 1
        super().__init__(self.problems[0] + (f" (and {more} more: llama-npu validate with the same arguments "
                                             f"lists them all)" if more else ""))


class Problems(list):
    """Problem lines collected, so that one bad key does not hide the next."""

    def check(self, fn, *args):
        """fn(*args), its RecipeError's problems collected; None then."""
        try:
            return fn(*args)
        except RecipeError as exc:
            self.extend(exc.problems)
        return None

    def passes(self, fn, *args) -> bool:
        """Whether fn(*args) added no problem (its problems collected)."""
        counted = len(self)
        self.check(fn, *args)
        return len(self) == counted

    def raise_any(self) -> None:
        if self:
            raise RecipeError(list(dict.fromkeys(self)))  # each once


def choice(key: str, value: str, allowed) -> None:
    if value not in allowed:
        raise RecipeError(f"{key}: expected one of {', '.join(allowed)}, got {value!r}")


def positive(key: str, value, allow_zero=False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise RecipeError(f"{key}: expected a value {bound}, got {value}")
