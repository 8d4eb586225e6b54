"""RecordError, the one error of bad input data: a leaf, so that the readers of each file
type (readers.py, tables.py, encodings.py) raise the same one."""
from __future__ import annotations


class RecordError(ValueError):
    """A bad input record or file. `reason` is a short key for the skip report."""

    def __init__(self, message: str, reason: str = "unreadable file"):
        super().__init__(message)
        self.reason = reason
