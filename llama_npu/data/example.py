"""The first training example as the model sees it: its tokens decoded, special tokens and
all, with the tokens the loss scores between SCORED marks. `train` prints it once at the start
of every run and `train --print-example` prints it alone; it is how a template or masking
mistake shows before hours are spent on it. LLaMA-Factory prints its first example so
(processor/supervised.py print_data_example: the inputs decoded, then the labels' tokens
decoded apart); here both are one text, the scored spans marked in place.
"""
from __future__ import annotations

import dataclasses
from typing import List, Tuple

from ..model.tokens import IGNORE_ID
from .samples import Sample

SCORED = ("⟦", "⟧")  # rare in any text, Chinese included (unlike 【】)


def example_rows(item) -> List[Tuple[str, Sample]]:
    """(name, row) of a source's first item: an SFT sample or packed row, a DPO pair's two rows,
    a KTO reply (named by its label)."""
    item = item[1] if isinstance(item, tuple) else item  # DPO's and KTO's sources give (index, item)
    if isinstance(item, Sample):
        return [("", item)]
    rows = [(f.name, getattr(item, f.name)) for f in dataclasses.fields(item)
            if isinstance(getattr(item, f.name), Sample)]
    labels = [f"{f.name}={getattr(item, f.name)}" for f in dataclasses.fields(item)
              if not isinstance(getattr(item, f.name), Sample)]
    return [(" ".join(filter(None, [name if len(rows) > 1 else ""] + labels)), row) for name, row in rows]


def first_sample(row: Sample) -> Tuple[list, list]:
    """(ids, labels) of a row's first sample: a packed row holds several, segment 1 first."""
    ids, labels = list(row.input_ids), list(row.labels)
    if row.segment_ids is not None:
        keep = [i for i, segment in enumerate(row.segment_ids) if segment == 1]
        ids, labels = [ids[i] for i in keep], [labels[i] for i in keep]
    return [int(i) for i in ids], [int(label) for label in labels]


def marked_text(tokenizer, ids: list, labels: list) -> str:
    """The ids decoded, each run of scored tokens (a label that is not IGNORE_ID) between SCORED."""
    runs, start = [], 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or (labels[end] != IGNORE_ID) != (labels[start] != IGNORE_ID):
            text = tokenizer.decode(ids[start:end], skip_special_tokens=False)
            runs.append(f"{SCORED[0]}{text}{SCORED[1]}" if labels[start] != IGNORE_ID else text)
            start = end
    return "".join(runs)


def describe_first_example(source, tokenizer) -> str:
    """The first training item of `source` (a BatchStream source), each of its rows decoded
    with its scored tokens marked."""
    lines = []
    for name, row in example_rows(next(iter(source.iterate([0])))):
        ids, labels = first_sample(row)
        scored = sum(label != IGNORE_ID for label in labels)
        lines.append(f"first training example{f' ({name})' if name else ''}: {len(ids)} tokens, {scored} scored "
                     f"(between {SCORED[0]} and {SCORED[1]}):")
        lines.append(marked_text(tokenizer, ids, labels))
    return "\n".join(lines)
