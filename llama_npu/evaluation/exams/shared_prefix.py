"""Exam rows packed under their shared prefix: one forward for the prefix a group of rows
has in common, not one for each row.

A few-shot prompt repeats the task's description and the same shots for every question of a
subject (lm-eval's `first_n` sampler): at five shots 76-81% of an exam's tokens are such a
prefix (the C-Eval sample; 30% at zero shots, the description). A pack is one input row of
the backbone: the group's common prefix once, then each row's own tokens after it. Its
tokens carry
- their position in their own row (the prefix's 0..P-1, each row's own tokens from P on),
  so the rotary embedding sees every row as it would alone;
- a segment: 0 for the prefix, k for the k-th row's own tokens; a token attends to the
  earlier tokens of the prefix and of its own segment (segment_mask), so every row's
  hidden states are those it has alone, up to float rounding.

The pack's width is capped (choose_cap): a wider pack shares more but its attention
computes every pair of its tokens, masked or not.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

PAD_SEGMENT = -1  # padding after a pack's tokens: no real token comes after it, so none attends to it


@dataclass
class Pack:
    ids: List[int] = field(default_factory=list)
    positions: List[int] = field(default_factory=list)
    segments: List[int] = field(default_factory=list)
    prefix: int = 0  # tokens of the shared prefix, at the pack's start
    starts: Dict[tuple, int] = field(default_factory=dict)  # row -> where its own tokens start in the pack

    def __len__(self) -> int:
        return len(self.ids)

    def index(self, row: tuple, position: int) -> int:
        """Where `row`'s token at `position` sits in the pack."""
        return position if position < self.prefix else self.starts[row] + position - self.prefix


def common_length(a: tuple, b: tuple) -> int:
    """The length of the prefix `a` and `b` share."""
    import numpy as np

    n = min(len(a), len(b))
    differ = np.asarray(a[:n]) != np.asarray(b[:n])
    return int(differ.argmax()) if differ.any() else n


def _pack(rows: Sequence[tuple], prefix: int) -> Pack:
    pack = Pack(ids=list(rows[0][:prefix]), positions=list(range(prefix)), segments=[0] * prefix, prefix=prefix)
    for k, row in enumerate(rows, 1):
        pack.starts[row] = len(pack.ids)
        pack.ids += row[prefix:]
        pack.positions += range(prefix, len(row))
        pack.segments += [k] * (len(row) - prefix)
    return pack


def pack_rows(ordered: Sequence[tuple], shared: Sequence[int], cap: int) -> List[Pack]:
    """Rows (distinct, each at most `cap` long) in lexicographic order, so that rows with a
    common prefix are neighbours, and `shared[i]`, the prefix row i shares with row i - 1, in
    packs of at most `cap` tokens: each row joins the current pack while the pack still fits."""
    packs: List[Pack] = []
    start, prefix, own = 0, len(ordered[0]) if ordered else 0, 0  # own: the group's tokens past its prefix
    for i in range(1, len(ordered)):
        row, members = ordered[i], i - start
        common = min(prefix, shared[i])  # sorted: a group's common prefix is the least of its neighbours'
        grown = own + (prefix - common) * members + len(row) - common
        if common + grown <= cap:
            prefix, own = common, grown
            continue
        packs.append(_pack(ordered[start:i], prefix))
        start, prefix, own = i, len(row), 0
    if ordered:
        packs.append(_pack(ordered[start:], prefix))
    return packs


def segment_mask(segments: Sequence[Sequence[int]]):
    """(B, W, W) bool numpy, True where query token i may attend key token j: j <= i and j is
    in the prefix (segment 0) or in i's own segment. The graph builds the same from the
    segments (scoring cell); this is the reference its tests check it against."""
    import numpy as np

    seg = np.asarray(segments)
    width = seg.shape[1]
    causal = np.tril(np.ones((width, width), bool))
    return causal & ((seg[:, :, None] == seg[:, None, :]) | (seg[:, None, :] == 0))


def pack_cost(packs: Sequence[Pack], batch_size: int, token_cost: float, pair_cost: float) -> float:
    """The backbone's multiply-adds over `packs` batched `batch_size` at a time, longest
    first, each batch padded to its longest pack: token_cost a token, pair_cost a pair of
    tokens its attention computes (all W x W of a row, masked or not)."""
    widths = sorted((len(p) for p in packs), reverse=True)
    batches = [widths[i:i + batch_size] for i in range(0, len(widths), batch_size)]
    return sum(len(b) * b[0] * (token_cost + b[0] * pair_cost) for b in batches)


def choose_cap(rows: Sequence[tuple], batch_size: int, max_len: int, token_cost: float,
               pair_cost: float) -> Tuple[int, List[Pack]]:
    """The pack width of least pack_cost among the powers of two from the longest row's up to
    `max_len` (and `max_len` itself), and its packs."""
    ordered = sorted(rows)
    shared = [0] + [common_length(a, b) for a, b in zip(ordered, ordered[1:])]
    longest = max((len(r) for r in ordered), default=1)
    cap, caps = 1, []
    while cap < longest:
        cap *= 2
    while cap < max_len:
        caps.append(cap)
        cap *= 2
    caps.append(max(longest, max_len))
    choices = [(pack_cost(packs, batch_size, token_cost, pair_cost), cap, packs)
               for cap, packs in ((c, pack_rows(ordered, shared, c)) for c in caps)]
    _, cap, packs = min(choices, key=lambda c: (c[0], c[1]))
    return cap, packs
