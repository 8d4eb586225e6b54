"""A precomputed reference (dpo.reference precomputed): the starting weights' summed reply
log-probs of every row of every training item (a pair's chosen and rejected rows), computed
once before step 1 and stored in the run directory with the SHA-256 of those weights and of
the tokenized items, as MindRLHF precomputes them offline and warns that they must come from
the same checkpoint. A resume reuses them when both digests match and refuses otherwise,
naming both; a run stopped during the pass wrote nothing and computes it again.

An item is anything with `rows`, its samples (Sample: input_ids, labels) in a fixed order;
a batch of P items is their first rows, then their second rows, and so on (TRL's
concatenated order), so the log-probs come back as an (N, rows) array.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

import mindspore as ms

from ..checkpoints.files import CheckpointError
from ..common.atomic import replace_file
from ..common.console import note, progress_bar
from ..data.samples import pad_items
from ..model.tokens import PAD_ID
from .sequence_logps import SequenceLogProbs

REFERENCE_FILE = "reference_logps.npz"


def weights_digest(params) -> str:
    """SHA-256 of the weights' bytes: equal digests mean bit-identical weights."""
    digest = hashlib.sha256()
    for p in params:
        digest.update(p.asnumpy().tobytes())
    return digest.hexdigest()[:16]


def items_digest(items) -> str:
    """SHA-256 of the tokenized items (ids and labels of every row, in order)."""
    digest = hashlib.sha256()
    for item in items:
        for sample in item.rows:
            digest.update(np.asarray(sample.input_ids, np.int64).tobytes() + b"|")
            digest.update(np.asarray(sample.labels, np.int64).tobytes() + b"/")
    return digest.hexdigest()[:16]


def reference_log_probs(cell: SequenceLogProbs, items, batch_items: int, length: int,
                        label: str = "reference", unit: str = "pair") -> np.ndarray:
    """(N, R) summed reply log-probs of each item's R rows, `batch_items` items a forward
    pass (the last batch padded with the first items, so one graph serves); `label` names
    the pass on its progress bar (eval scores the policy with it too), `unit` an item."""
    rows = len(items[0].rows) if len(items) else 0
    out = np.zeros((len(items), rows), np.float32)
    with progress_bar(len(items), label, unit) as progress:
        for start in range(0, len(items), batch_items):
            chunk = list(items[start:start + batch_items])
            real = len(chunk)
            chunk += list(items[:batch_items - real])
            ids, labels = pad_items(chunk, length, PAD_ID)
            sums = cell(ms.Tensor(ids), ms.Tensor(labels))[0].asnumpy()
            for r in range(rows):
                out[start:start + real, r] = sums[r * batch_items:r * batch_items + real]
            progress.update(real)
    return out


def precomputed_reference(run_dir: Path, net, chunk_size, items, batch_items: int, length: int,
                          writes: bool, unit: str = "pair") -> np.ndarray:
    """The stored reference of this run, checked against `net`'s weights (the starting ones:
    called before a resume loads a checkpoint) and `items`; else computed now (and stored
    when `writes`: rank 0). `unit` names an item in the notes and the stored digest's key."""
    path = Path(run_dir) / REFERENCE_FILE
    weights, data = weights_digest(net.get_parameters()), items_digest(items)
    data_key = f"{unit}s_sha256"
    if path.exists():
        stored = np.load(path)
        mismatched = [f"{what} {str(stored[key])} (stored) != {now} (this run)" for what, key, now in
                      (("weights sha256", "weights_sha256", weights), (f"{unit}s sha256", data_key, data))
                      if str(stored[key]) != now]
        if mismatched:
            raise CheckpointError(f"{path}: the precomputed reference comes from other starting weights or data: "
                                  f"{'; '.join(mismatched)}; resume with the run's own model.checkpoint and data, "
                                  f"or start a new run")
        note(f"reference log-probs of {len(items)} {unit}s reused from {path} (weights {weights}, {unit}s {data})")
        return stored["log_probs"]
    note(f"reference pass: the starting weights' log-probs of {len(items)} {unit}s, before step 1")
    log_probs = reference_log_probs(SequenceLogProbs(net, chunk_size), items, batch_items, length, unit=unit)
    if writes:
        def write(tmp):
            with open(tmp, "wb") as f:
                np.savez(f, log_probs=log_probs, weights_sha256=weights, **{data_key: data})

        replace_file(path, write)
    return log_probs
