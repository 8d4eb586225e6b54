"""`llama-npu eval --checkpoint RUN --data FILE` of a KTO run on labelled replies: its KTO loss,
KL estimate and TRL's metrics over held-out replies, against the run's own reference -- its
starting weights (model.checkpoint; under adapters_off the same: the base without adapters).
The held-out KL rows pair each prompt with the previous record's reply over the whole file
set (replies.py kl_rows), and the losses are the run's own cells (loss.py KtoTerms)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

import mindspore as ms

from ...common.console import note
from ...data.readers import RecordError
from ...data.source import read_files
from ...data.tables import ReadOptions
from ...data.tokenizer import load_tokenizer
from ..reference_pass import reference_log_probs
from ..sequence_logps import SequenceLogProbs
from .loss import KtoTerms, side_metrics, side_sums
from .records import RECORDS
from .reference import kl_item
from .replies import kl_partners, tokenize_kto
from .section import NAME


def log_probs(load, checkpoint: Path, items, batch_size: int, length: int, device: str, label: str) -> np.ndarray:
    """(N,) summed reply log-probs of the model in `checkpoint` (LoRA adapters folded in)."""
    net, chunk_size = load(checkpoint, length - 1, batch_size, device)
    return reference_log_probs(SequenceLogProbs(net, chunk_size), items, batch_size, length, label, "row")[:, 0]


def evaluate_replies(recipe, checkpoint: Path, data_files, batch_size: Optional[int], device: str, load) -> dict:
    """The KTO loss, KL and metrics (TRL's names) and the reply count over `data_files`, at
    the run's data.max_seq_len, `batch_size` rows a forward pass (None: the run's
    train.micro_batch_size)."""
    if recipe is None or recipe.train.objective != NAME:
        raise RecordError(f"--data holds labelled replies, but {checkpoint} is not a KTO run's directory or step; "
                          f"labelled replies are scored against a run's own reference")
    if not recipe.model.checkpoint:
        raise RecordError(f"{checkpoint}: the run started from random weights (no model.checkpoint), so its "
                          f"reference cannot be built again to score held-out replies")
    batch_size = batch_size or recipe.train.micro_batch_size
    length = recipe.data.max_seq_len + 1
    reading = ReadOptions.of_data(recipe.data)  # as the run read its training replies
    records = read_files(data_files, reading, recipe.data.on_bad_record, RECORDS)
    samples, report = tokenize_kto(load_tokenizer(recipe.data.tokenizer), records, length, recipe.data.truncation)
    for line in report.cuts.lines(recipe.data.truncation, length, "labelled replies"):
        note(line)
    if len(samples) < 2:
        raise RecordError(f"{', '.join(map(str, data_files))}: {len(samples)} labelled reply kept; the KL estimate "
                          f"pairs each prompt with another reply, so scoring needs 2 or more")
    items = list(samples) + [kl_item(samples, i, int(j), length) for i, j in enumerate(kl_partners(len(samples)))]
    policy = log_probs(load, Path(checkpoint), items, batch_size, length, device, "policy")
    reference = log_probs(load, Path(recipe.model.checkpoint), items, batch_size, length, device, "reference")
    n = len(samples)
    kl = max(float((policy[n:] - reference[n:]).mean()), 0.0)
    desirable = ms.Tensor(np.array([s.desirable for s in samples], np.float32))
    losses, rewards = KtoTerms(recipe.kto)(ms.Tensor(policy[:n]), ms.Tensor(reference[:n]), desirable,
                                           ms.Tensor(np.float32(kl)))
    sums = side_sums(rewards, ms.Tensor(policy[:n]), desirable).asnumpy()
    return {"checkpoint": str(checkpoint), "replies": n, "loss": float(losses.asnumpy().mean()),
            **side_metrics(sums, kl), "reference": recipe.model.checkpoint}
