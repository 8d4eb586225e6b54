"""A rehearsal's sequence length for an objective whose records are a prompt and a reply
(training/rehearse.py; objectives/dpo/rehearsal.py says why): the shortest multiple of the SFT
rehearsal's length at which enough items keep a reply, never more than the recipe's own
length nor CAP (a CPU step's logits are 128,256 fp32 values a token), the others left out
(data.on_bad_record: skip), saying how many. Pure Python."""
from __future__ import annotations

from typing import List, Optional, Tuple

from ..strategies.accumulation import step_rows

CAP = 256


def rehearsed_items(recipe) -> int:
    """The items a rehearsal trains on (its first ones): what its steps read, so that a
    reference pass before step 1 is as short as the rehearsal."""
    return step_rows(recipe) * recipe.train.max_steps


def first_items_note(rehearsal, what: str) -> list:
    """The rehearsal summary's line saying it trains on its first `what` only."""
    return [f"the first {rehearsed_items(rehearsal)} training {what} only, what {rehearsal.train.max_steps} steps "
            f"read: the reference pass is over them"]


def shrink_to_fit(r, shortest: int, needed: int, lengths: Optional[List[Tuple[int, int]]], what: str) -> int:
    """From `shortest` up in steps of it (at most the recipe's length and CAP), the first
    data.max_seq_len at which `needed` items keep a reply (data.truncation: keep_prompt) or
    stay whole (drop), given each item's (prompt tokens, longest row's tokens); the items
    without room are skipped. keep_end and keep_start keep a reply of every item at any length."""
    d = r.recipe.data
    longest = min(d.max_seq_len, CAP)
    whole = d.truncation == "drop"
    if lengths is None or shortest >= longest or d.truncation not in ("keep_prompt", "drop"):
        return min(shortest, d.max_seq_len)
    needed = min(needed, len(lengths))
    for length in [*range(shortest, longest, shortest), longest]:
        # an item keeps a reply when its prompt is shorter than the row of length + 1 tokens
        room = sum(prompt <= length for prompt, _ in lengths)
        kept = sum(prompt <= length and row <= length + 1 for prompt, row in lengths) if whole else room
        if kept >= needed:
            break
    r.change("data.max_seq_len", length, f"the shortest multiple of {shortest} at which {needed} {what} "
             f"keep a reply" if length > shortest else "")
    if room < len(lengths) and not whole:  # under drop they are left out, counted, never refused
        r.change("data.on_bad_record", "skip", f"{len(lengths) - room} of {len(lengths)} {what} have a "
                 f"prompt of more than {length} tokens, no room for a reply: left out of the rehearsal")
    return length
