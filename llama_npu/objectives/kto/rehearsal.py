"""A KTO recipe's rehearsal (training/rehearse.py): its sequence length and its records.

As a DPO rehearsal's (objectives/dpo/rehearsal.py says why; objectives/rehearsal_length.py): the shortest multiple of the
SFT rehearsal's length at which enough records for its steps keep a reply (a record whose
prompt fills the row is left out, data.on_bad_record: skip, saying how many), never more
than the recipe's own length nor CAP; and it trains on its first records only, so that the
reference pass is as short as the rehearsal.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from ..rehearsal_length import first_items_note, rehearsed_items, shrink_to_fit


def _lengths(recipe) -> Optional[List[Tuple[int, int]]]:
    """(prompt tokens, row tokens) of each readable training record, or None when the files
    cannot be read: the rehearsal's pre-flight then says why, against its own recipe."""
    # imported here: tokenizing loads the tokenizer and numpy, needless for the SFT rehearsal
    from ...data.dataset_info import train_inputs
    from ...data.readers import RecordError
    from ...data.source import read_records
    from ...data.tokenizer import load_tokenizer
    from .records import RECORDS
    from .replies import reply_span, tokenize_kto

    d = recipe.data
    try:
        records = read_records(recipe, train_inputs(recipe), RECORDS, rehearsing=True)
        samples = tokenize_kto(load_tokenizer(d.tokenizer), records, 1 << 30, "keep_prompt", bar=False)[0]
    except (OSError, RecordError, ValueError):
        return None
    return [(reply_span(s.sample.labels)[0], len(s.sample.input_ids)) for s in samples] or None


def shrink_length(r, shortest: int, needed: int) -> int:
    return shrink_to_fit(r, shortest, needed, _lengths(r.recipe), "training records")


def first_records(source, recipe):
    from .replies import KtoSource  # imported here: it loads numpy, needless for validate

    return KtoSource(source.samples[:rehearsed_items(recipe)])


def rehearsal_notes(rehearsal) -> list:
    return first_items_note(rehearsal, "records")
