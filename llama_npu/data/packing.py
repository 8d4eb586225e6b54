"""Packing: several samples in one row of fixed length, in order, first come first placed.

Each sample keeps its own segment id (1, 2, ...; 0 marks padding). The loss cell turns the
segment ids into a block-diagonal causal mask, so no token attends to another sample, and
every sample's first label is IGNORE_ID, so no token is predicted across a boundary.
Positions are not restarted per sample: MindFormers' Llama takes one rotary table for the
whole row, and rotary attention depends only on the distance between two tokens of the
same sample, which packing does not change (tests/test_data.py checks the per-sample loss).
"""
from __future__ import annotations

from typing import List, Sequence

from .samples import Sample


def pack(samples: Sequence[Sample], length: int) -> List[Sample]:
    rows: List[Sample] = []
    current = Sample([], [], [])
    for sample in samples:
        if len(current.input_ids) + len(sample.input_ids) > length:
            rows.append(current)
            current = Sample([], [], [])
        segment = (current.segment_ids[-1] if current.segment_ids else 0) + 1
        current.input_ids += sample.input_ids
        current.labels += sample.labels
        current.segment_ids += [segment] * len(sample.input_ids)
    if current.input_ids:
        rows.append(current)
    return rows
