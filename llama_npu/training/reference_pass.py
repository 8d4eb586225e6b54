"""dpo.reference precomputed: the starting weights' summed reply log-probs of every training
pair, computed once before step 1 and stored in the run directory with the SHA-256 of those
weights and of the tokenized pairs, as MindRLHF precomputes them offline and warns that they
must come from the same checkpoint. A resume reuses them when both digests match and refuses
otherwise, naming both; a run stopped during the pass wrote nothing and computes it again.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

import mindspore as ms

from ..checkpoints.files import CheckpointError
from ..common.atomic import replace_file
from ..common.console import note, progress_bar
from ..data.pairs import pad_pair_batch
from ..model.tokens import PAD_ID
from ..objectives.sequence_logps import SequenceLogProbs

REFERENCE_FILE = "reference_logps.npz"


def weights_digest(params) -> str:
    """SHA-256 of the weights' bytes: equal digests mean bit-identical weights."""
    digest = hashlib.sha256()
    for p in params:
        digest.update(p.asnumpy().tobytes())
    return digest.hexdigest()[:16]


def pairs_digest(pairs) -> str:
    """SHA-256 of the tokenized pairs (ids and labels of both rows, in order)."""
    digest = hashlib.sha256()
    for pair in pairs:
        for sample in (pair.chosen, pair.rejected):
            digest.update(np.asarray(sample.input_ids, np.int64).tobytes() + b"|")
            digest.update(np.asarray(sample.labels, np.int64).tobytes() + b"/")
    return digest.hexdigest()[:16]


def reference_log_probs(cell: SequenceLogProbs, pairs, batch_pairs: int, length: int,
                        label: str = "reference") -> np.ndarray:
    """(N, 2) summed reply log-probs of each pair's chosen and rejected rows, `batch_pairs`
    pairs a forward pass (the last batch padded with the first pairs, so one graph serves);
    `label` names the pass on its progress bar (eval scores the policy with it too)."""
    out = np.zeros((len(pairs), 2), np.float32)
    with progress_bar(len(pairs), label, "pair") as progress:
        for start in range(0, len(pairs), batch_pairs):
            chunk = list(pairs[start:start + batch_pairs])
            real = len(chunk)
            chunk += list(pairs[:batch_pairs - real])
            ids, labels = pad_pair_batch(chunk, length, PAD_ID)
            sums = cell(ms.Tensor(ids), ms.Tensor(labels))[0].asnumpy()
            out[start:start + real, 0] = sums[:real]
            out[start:start + real, 1] = sums[batch_pairs:batch_pairs + real]
            progress.update(real)
    return out


def precomputed_reference(run_dir: Path, net, chunk_size, pairs, batch_pairs: int, length: int,
                          writes: bool) -> np.ndarray:
    """The stored reference of this run, checked against `net`'s weights (the starting ones:
    called before a resume loads a checkpoint) and `pairs`; else computed now (and stored
    when `writes`: rank 0)."""
    path = Path(run_dir) / REFERENCE_FILE
    weights, data = weights_digest(net.get_parameters()), pairs_digest(pairs)
    if path.exists():
        stored = np.load(path)
        mismatched = [f"{what} {str(stored[key])} (stored) != {now} (this run)" for what, key, now in
                      (("weights sha256", "weights_sha256", weights), ("pairs sha256", "pairs_sha256", data))
                      if str(stored[key]) != now]
        if mismatched:
            raise CheckpointError(f"{path}: the precomputed reference comes from other starting weights or data: "
                                  f"{'; '.join(mismatched)}; resume with the run's own model.checkpoint and data, "
                                  f"or start a new run")
        note(f"reference log-probs of {len(pairs)} pairs reused from {path} (weights {weights}, pairs {data})")
        return stored["log_probs"]
    note(f"reference pass: the starting weights' log-probs of {len(pairs)} pairs, before step 1")
    log_probs = reference_log_probs(SequenceLogProbs(net, chunk_size), pairs, batch_pairs, length)
    if writes:
        def write(tmp):
            with open(tmp, "wb") as f:
                np.savez(f, log_probs=log_probs, weights_sha256=weights, pairs_sha256=data)

        replace_file(path, write)
    return log_probs
