"""`llama-npu eval --checkpoint RUN --data PAIRS` of a DPO run on preference pairs: the run's
loss, reward accuracy and margin over held-out pairs, against the run's own reference -- its
starting weights (model.checkpoint), as its precomputed reference was (objectives/reference_pass.py).
The losses are the run's own cells (loss.py), so eval and training agree."""
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
from ...model.tokens import IGNORE_ID
from ..reference_pass import reference_log_probs
from ..sequence_logps import SequenceLogProbs, WholeRowMeans
from .loss import PairLoss, metric_names, pair_metrics
from .pairs import tokenize_pairs
from .records import RECORDS
from .section import LENGTH_NORMALISED, NAME

def run_recipe(recipe, checkpoint: Path):
    """`recipe`, that of the run `checkpoint` is or belongs to, when it is a DPO run's."""
    if recipe is None or recipe.train.objective != NAME:
        raise RecordError(f"--data holds preference pairs, but {checkpoint} is not a DPO run's directory or step; "
                          f"pairs are scored against a run's own reference")
    return recipe


def log_probs(load, checkpoint: Path, pairs, batch_size: int, length: int, device: str, orpo: bool = False,
              label: str = "policy"):
    """(N, 2) summed reply log-probs of the model in `checkpoint` (LoRA adapters folded in,
    `load`: evaluation/loaded_model.py scoring_network); `orpo`: and (N,) the chosen rows'
    NLL over their whole tokens (ORPO's term)."""
    net, chunk_size = load(checkpoint, length - 1, 2 * batch_size, device)
    sequences = SequenceLogProbs(net, chunk_size)
    summed = reference_log_probs(sequences, pairs, batch_size, length, label)
    if not orpo:
        return summed
    return summed, -reference_log_probs(WholeRowMeans(sequences), pairs, batch_size, length, "policy NLL")[:, 0]


def evaluate_pairs(recipe, checkpoint: Path, data_files, batch_size: Optional[int], device: str, load) -> dict:
    """The DPO loss, the metrics (TRL's names) and the pair count over `data_files`, at the
    run's data.max_seq_len (`recipe`: the run's, None when `checkpoint` belongs to no run),
    `batch_size` pairs a forward pass (None: the run's train.micro_batch_size: on the CPU
    backend a graph keeps all its buffers, so 4 pairs a pass at the run's length took twice
    the memory of the run's own 1 pair a micro-batch); `load`: as log_probs takes it."""
    recipe = run_recipe(recipe, checkpoint)
    batch_size = batch_size or recipe.train.micro_batch_size
    d = recipe.dpo
    if d.reference != "none" and not recipe.model.checkpoint:
        raise RecordError(f"{checkpoint}: the run started from random weights (no model.checkpoint), so its "
                          f"reference cannot be built again to score held-out pairs")
    length = recipe.data.max_seq_len + 1
    # read as the run read its training pairs: its data.columns and data.encoding
    reading = ReadOptions.of_data(recipe.data)
    records = read_files(data_files, reading, recipe.data.on_bad_record, RECORDS)
    pairs, report = tokenize_pairs(load_tokenizer(recipe.data.tokenizer), records, length, recipe.data.truncation)
    for line in report.cuts.lines(recipe.data.truncation, length, "preference pairs"):
        note(line)
    nll = None
    if d.loss == "orpo":
        policy, nll = log_probs(load, Path(checkpoint), pairs, batch_size, length, device, orpo=True)
    else:
        policy = log_probs(load, Path(checkpoint), pairs, batch_size, length, device)
    reference = (np.zeros_like(policy) if d.reference == "none" else
                 log_probs(load, Path(recipe.model.checkpoint), pairs, batch_size, length, device, label="reference"))
    if d.loss in LENGTH_NORMALISED:
        lengths = np.array([[sum(t != IGNORE_ID for t in s.labels) for s in (p.chosen, p.rejected)] for p in pairs],
                           np.float32)  # reply tokens: the targets SequenceLogProbs sums
        policy, reference = policy / lengths, reference / lengths
    losses, chosen_rewards, rejected_rewards, extra = PairLoss(d)(
        *(ms.Tensor(a) for a in (policy[:, 0], policy[:, 1], reference[:, 0], reference[:, 1])),
        None if nll is None else ms.Tensor(nll))
    sums = pair_metrics(chosen_rewards, rejected_rewards, ms.Tensor(policy[:, 0]), ms.Tensor(policy[:, 1]),
                        *extra).asnumpy()
    return {"checkpoint": str(checkpoint), "pairs": len(pairs), "loss": float(losses.asnumpy().mean()),
            **{name: float(v) / len(pairs) for name, v in zip(metric_names(d.loss), sums)}, "dpo_loss": d.loss,
            "reference": d.reference if d.reference == "none" else recipe.model.checkpoint}
