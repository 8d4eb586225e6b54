"""A DPO recipe's rehearsal (training/rehearse.py): its sequence length and its pairs.

An SFT rehearsal trains 32-token sequences. A preference pair is refused when its prompt
leaves no reply token within data.max_seq_len under data.truncation: keep_prompt (pairs.py),
and the Llama 3 chat template's headers alone take 15 tokens: at 32 a quarter of the shipped
data/zh_pref_train.jsonl has no room (its prompts run to 121 tokens). So under keep_prompt a
DPO rehearsal takes the shortest multiple of 32 at which enough pairs for its steps keep a
reply (under drop: stay whole; keep_end and keep_start cut every pair to fit, and 32 is
kept), never more than the recipe's own length nor CAP (a CPU
step's logits are 128,256 fp32 values a token), and leaves the other pairs out
(data.on_bad_record: skip), saying how many. It trains on the first pairs only, as many as
its steps read, so that the reference pass (objectives/reference_pass.py: a forward pass over
every training pair) is as short as the rehearsal, not hours over a large data set.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from ..rehearsal_length import first_items_note, rehearsed_items, shrink_to_fit


def _lengths(recipe) -> Optional[List[Tuple[int, int]]]:
    """(prompt tokens, longer row's tokens) of each readable training pair, or None when the
    files cannot be read: the rehearsal's pre-flight then says why, against its own recipe."""
    # imported here: tokenizing loads the tokenizer and numpy, needless for the SFT rehearsal
    from ...data.dataset_info import train_inputs
    from ...data.readers import RecordError
    from ...data.source import read_records
    from ...data.tokenizer import load_tokenizer
    from .pairs import pair_lengths
    from .records import RECORDS

    d = recipe.data
    try:
        records = read_records(recipe, train_inputs(recipe), RECORDS, rehearsing=True)
        return pair_lengths(load_tokenizer(d.tokenizer), records) or None
    except (OSError, RecordError, ValueError):
        return None


def shrink_pair_length(r, shortest: int, pairs_needed: int) -> int:
    """The rehearsal's data.max_seq_len for a DPO recipe: from `shortest` (the SFT
    rehearsal's) up in steps of it, the first at which `pairs_needed` pairs keep a reply;
    the pairs without room there are skipped (data.on_bad_record: skip)."""
    return shrink_to_fit(r, shortest, pairs_needed, _lengths(r.recipe), "training pairs")


def first_pairs(source, recipe):
    """The rehearsal's training pairs: the first rehearsed_items, whose reference pass is short."""
    from .source import PairSource  # imported here: it loads numpy, needless for validate

    return PairSource(source.pairs[:rehearsed_items(recipe)])


def rehearsal_notes(rehearsal) -> list:
    """The rehearsal summary's line: it trains on the first pairs only (first_pairs)."""
    return first_items_note(rehearsal, "pairs")
