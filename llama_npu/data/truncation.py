"""data.truncation: what is kept of a record longer than a row (data.max_seq_len + 1 tokens),
one rule for every objective (SFT samples, DPO pairs, KTO replies), as the tools users come
from keep such records:

- keep_end (the default): the prompt loses its start, oldest turns first, keeping
  <|begin_of_text|> and the system message; the latest turn (the user's message and the
  assistant header) and the reply share what is left as LLaMA-Factory's infer_seqlen shares
  it (each whole when it takes under half), the latest turn keeping its end and the reply
  its start, and older turns fill what is still free, newest first. TRL 0.24 keeps the
  prompt's end by default (DPOConfig / KTOConfig truncation_mode="keep_end").
- keep_start: LLaMA-Factory's split exactly (src/llamafactory/data/processor/
  processor_utils.py infer_seqlen): turn by turn from the earliest for SFT
  (processor/supervised.py), the prompt as one block for pairs and KTO (pairwise.py,
  feedback.py), the start of each part kept.
- keep_prompt: the whole prompt, the reply's end cut; dropped when the prompt alone fills
  the row (an SFT row is cut at the length as it was before the key existed, and dropped
  when no target token is left).
- drop: a record that does not fit whole is left out.

A pair's two replies are cut alike (the longer one decides), as both tools do. Under
keep_end and keep_start a record is dropped only when no reply token can fit: where
infer_seqlen's rounding would give a reply no token while room is left (a prompt hundreds
of times its reply), the reply keeps one, taken from the prompt. Plain-text documents keep
their start under every mode but drop (TRL's SFT cuts a sequence at max_length). Pure
Python: validate reads MODES.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

MODES = ("keep_end", "keep_start", "keep_prompt", "drop")
DEFAULT = "keep_end"
# What a run whose stored recipe.yaml predates data.truncation did: its resume keeps it.
BEFORE_THE_KEY = "keep_prompt"
START_HEADER_ID = 128006  # <|start_header_id|> (data/tokenizer.py SPECIAL_TOKENS)

Ranges = List[Tuple[int, int]]  # [start, stop) spans of a row's tokens, in order


def infer_seqlen(source_len: int, target_len: int, cutoff_len: int) -> Tuple[int, int]:
    """LLaMA-Factory's processor_utils.infer_seqlen, line for line: the source's and the
    target's lengths after truncation to cutoff_len."""
    if target_len * 2 < cutoff_len:  # truncate source
        max_target_len = cutoff_len
    elif source_len * 2 < cutoff_len:  # truncate target
        max_target_len = cutoff_len - source_len
    else:  # truncate both
        max_target_len = int(cutoff_len * (target_len / (source_len + target_len)))
    new_target_len = min(max_target_len, target_len)
    max_source_len = max(cutoff_len - new_target_len, 0)
    new_source_len = min(max_source_len, source_len)
    return new_source_len, new_target_len


def reply_share(source_len: int, target_len: int, cutoff_len: int) -> Tuple[int, int]:
    """infer_seqlen, except that a reply keeps one token where it would keep none with room
    left (the module docstring's one difference from LLaMA-Factory)."""
    source, target = infer_seqlen(source_len, target_len, cutoff_len)
    if target == 0 and target_len > 0 and cutoff_len >= 1:
        source, target = min(source_len, cutoff_len - 1), 1
    return source, target


@dataclass(frozen=True)
class Layout:
    """A chat row's parts as token positions (data/chat_template.py builds the rows)."""
    head: int  # [0, head): <|begin_of_text|> and the system message
    latest: int  # [latest, reply): the latest turn, the user's message and the assistant header
    reply: int  # [reply, end): the final reply and its <|eot_id|>
    # (source start, target start, target end) of each turn: LLaMA-Factory's encode_multiturn
    # pairs (source: up to the assistant header; target: the reply and its <|eot_id|>)
    turns: Tuple[Tuple[int, int, int], ...]


def layout(ids: Sequence[int], assistant_header: Sequence[int], system_header: Sequence[int]) -> Optional[Layout]:
    """The Layout of a chat row, or None for a plain-text document (no header). User text
    never holds <|start_header_id|>: the tokenizer encodes special-token text as text."""
    starts = [i for i, token in enumerate(ids) if token == START_HEADER_ID]
    if not starts:
        return None
    ids, n = list(ids), len(assistant_header)
    head = starts[1] if len(starts) > 1 and ids[starts[0]:starts[0] + len(system_header)] == list(system_header) \
        else starts[0]
    turns, source = [], 0
    for k, start in enumerate(starts):
        if ids[start:start + n] == list(assistant_header):
            end = starts[k + 1] if k + 1 < len(starts) else len(ids)
            turns.append((source, start + n, end))
            source = end
    if not turns:
        return None
    first = max(turns[-1][0], head)  # a single turn's source holds the head too
    return Layout(head, first, turns[-1][1], tuple(turns))


def prompt_cut(mode: str, lay: Layout, reply_len: int, max_len: int) -> Optional[Tuple[Ranges, int]]:
    """(the prompt's kept ranges, the reply tokens kept) of a row whose prompt is
    [0, lay.reply) and whose reply (a pair's longer one) has `reply_len` tokens; None: the
    record is dropped."""
    prompt = lay.reply
    if prompt + reply_len <= max_len:
        return [(0, prompt)], reply_len
    if mode == "drop":
        return None
    if mode == "keep_prompt":
        return ([(0, prompt)], max_len - prompt) if prompt < max_len else None
    if mode == "keep_start":
        source, target = reply_share(prompt, reply_len, max_len)
        return [(0, source)], target
    head = min(lay.head, max_len - 1)
    room = max_len - head
    latest, target = reply_share(prompt - lay.latest, reply_len, room)
    older = min(lay.latest - lay.head, room - latest - target) if head == lay.head else 0
    return [(0, head), (lay.latest - older, lay.latest), (prompt - latest, prompt)], target


def turn_by_turn(lay: Layout, max_len: int) -> Ranges:
    """LLaMA-Factory's supervised.py _encode_data_example: each turn, from the earliest,
    takes infer_seqlen's share of what the turns before it left; a turn past the length is
    left out."""
    ranges, total = [], 0
    for k, (source, target, end) in enumerate(lay.turns):
        if total >= max_len:
            break
        share = reply_share if k == 0 else infer_seqlen  # the first turn keeps a reply token
        source_len, target_len = share(target - source, end - target, max_len - total)
        ranges += [(source, source + source_len), (target, target + target_len)]
        total += source_len + target_len
    return ranges


def row_cut(mode: str, lay: Optional[Layout], length: int, max_len: int) -> Optional[Ranges]:
    """The kept ranges of one SFT row of `length` tokens longer than `max_len` (`lay`: its
    Layout, None for a plain-text document); None: dropped."""
    if mode == "drop":
        return None
    if lay is None or mode == "keep_prompt":
        return [(0, max_len)]
    if mode == "keep_start":
        return turn_by_turn(lay, max_len)
    prompt, reply = prompt_cut(mode, lay, length - lay.reply, max_len)
    return prompt + [(lay.reply, lay.reply + reply)]


def take(tokens: Sequence[int], ranges: Ranges) -> list:
    """The tokens of `ranges`, in order."""
    return [t for start, stop in ranges for t in tokens[start:stop]]


def file_of(where: str) -> str:
    """The file of a record's file:line."""
    return where.rsplit(":", 1)[0]


@dataclass
class FileCounts:
    read: int = 0
    truncated: int = 0
    dropped: int = 0


@dataclass
class CutCounts:
    """How many records of each file were read, truncated and dropped, in reading order."""
    files: Dict[str, FileCounts] = field(default_factory=dict)

    def count(self, path: str, read: int = 1, truncated: int = 0, dropped: int = 0) -> None:
        counts = self.files.setdefault(path, FileCounts())
        counts.read, counts.truncated, counts.dropped = (counts.read + read, counts.truncated + truncated,
                                                         counts.dropped + dropped)

    def add(self, other: "CutCounts") -> None:
        for path, c in other.files.items():
            self.count(path, c.read, c.truncated, c.dropped)

    def count_record(self, where: str, truncated: bool = False, dropped: bool = False) -> None:
        """Count one record, by its file:line."""
        self.count(file_of(where), 1, int(truncated), int(dropped))

    def total(self, name: str) -> int:
        return sum(getattr(c, name) for c in self.files.values())

    def lines(self, mode: str, max_len: int, what: str, names: Optional[Dict[str, str]] = None) -> List[str]:
        """One line a file (`names`: how to name each path, the path itself by default): what
        the start of a run prints."""
        names = names or {}
        return [f"{names.get(path, path)}: {c.truncated} of {c.read} {what} truncated, {c.dropped} dropped (data.truncation: {mode}, "
                f"rows of {max_len} tokens)" for path, c in self.files.items()]
