"""The loss as a line of block characters, for the end-of-run summary and any log."""
from __future__ import annotations

import math
from typing import List

BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: List[float], width: int = 40) -> str:
    """`values` (non-finite ones left out) averaged into at most `width` buckets, each one block
    from ▁ (the lowest) to █ (the highest); "" when nothing is left."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return ""
    buckets = min(width, len(finite))
    means = []
    for i in range(buckets):
        part = finite[i * len(finite) // buckets:(i + 1) * len(finite) // buckets]
        means.append(sum(part) / len(part))
    low, high = min(means), max(means)
    if high == low:
        return BLOCKS[len(BLOCKS) // 2] * buckets
    return "".join(BLOCKS[round((m - low) / (high - low) * (len(BLOCKS) - 1))] for m in means)
