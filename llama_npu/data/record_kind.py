"""What an objective reads from a record (objectives/__init__.py RECORDS): its parser of each
format, the keys it reads, and how a record of its kind is told from another objective's.
The readers (data/readers.py) read every kind alike; SFT_RECORDS is the SFT objective's,
the readers' default. A leaf beside readers.py: it names no objective."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional, Set, Tuple

from .errors import RecordError


def no_record(raw: object) -> bool:
    """is_record of a kind whose records are told by no key of their own (SFT's)."""
    return False


@dataclass(frozen=True)
class RecordKind:
    # As messages name them ("SFT records", "preference pairs").
    name: str
    # format -> parse(raw record, "file:line", ReadOptions) -> the parsed record, or raises
    # RecordError (the options: data.tags, data.label_values, the file's column names);
    # a format without a parser is one the objective does not read (its check refuses it).
    parsers: Dict[str, Callable]
    # format -> the keys (after data.columns) its parser reads; a file's other columns are
    # named once, as unread.
    read_keys: Dict[str, Set[str]]
    # Whether a raw record (a dict, data.columns applied) is of this kind: a record of
    # another objective's kind is refused by name (`misread`), not by a missing key.
    # Every field is a module-level function (or a partial of one): prepare-data's worker
    # processes receive the kind pickled.
    is_record: Callable[[object], bool] = no_record
    # "file:line" -> the error when a record of this kind is read for another objective.
    misread: Optional[Callable[[str], RecordError]] = None
    # The parser's RecordError.reason for a record that is not of this kind, and the line
    # that replaces a file's errors when no record of it is (path -> message).
    not_mine: str = ""
    none_in_file: Optional[Callable[[Path], str]] = None
    # The other objectives' kinds, whose records this kind refuses with their `misread`
    # (objectives.records_of fills it from the registry).
    others: Tuple["RecordKind", ...] = ()
    # Whether its records are LLaMA-Factory's ranking data (a dataset_info.json entry's
    # `ranking: true`, data/dataset_info.py): an entry must say so exactly when it is.
    ranking: bool = False

    def misread_error(self, raw: object, where: str) -> Optional[RecordError]:
        """The error for `raw` when it is another objective's record, else None."""
        for other in self.others:
            if other.misread is not None and other.is_record(raw):
                return other.misread(where)
        return None
