"""What objectives that score a reply after a prompt (DPO's pairs, KTO's labelled replies)
say when the prompt alone fills data.max_seq_len under data.truncation: keep_prompt."""
from __future__ import annotations

from ..data.errors import RecordError


def no_room_error(where: str, prompt_tokens: int, max_seq_len: int, skip_hint: str) -> RecordError:
    """The record at `where` keeps no reply token to score; `skip_hint` says how to drop such
    records in the objective's words."""
    return RecordError(f"{where}: the prompt takes {prompt_tokens} tokens, which leaves no room for a reply within "
                       f"data.max_seq_len={max_seq_len} under data.truncation: keep_prompt; shorten it, raise "
                       f"data.max_seq_len or set data.truncation: keep_end; {skip_hint}",
                       "no room for a reply")


def no_room_errors(tokenize, tokenizer, records, recipe, skip_hint: str) -> list:
    """An objective's pre-flight: the records whose prompt leaves no reply token within
    data.max_seq_len, as errors. `tokenize(tokenizer, records, length, truncation, bar=False)`
    is its own tokenizing, whose report (its second value) lists them in `no_room`."""
    max_seq_len = recipe.data.max_seq_len
    report = tokenize(tokenizer, records, max_seq_len + 1, recipe.data.truncation, bar=False)[1]
    return [no_room_error(where, tokens, max_seq_len, skip_hint) for where, tokens in report.no_room]
