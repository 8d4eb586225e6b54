"""KTO's KL estimate, once an optimizer step: the objective's `prepare` (objectives/parts.py),
which the loop runs on each step's k micro-batches before the step: the KL pass scores the
step's KL rows, and each micro-batch then carries the estimate in its `extra` array.

Why a step and not a micro-batch. TRL estimates the KL over a device's batch
(kto_trainer.py kto_loss) and refuses a batch of 1, where a record's KL completion would be
its own reply. With accumulation its estimate would change with the micro-batch size. Here
the KL rows are the step's records, each prompt with the reply of the step's previous record
(replies.py kl_rows), so k micro-batches of B give the estimate one batch of kB
gives -- accumulation stays exact -- and a micro-batch of 1 works when the step holds 2
records or more (section.py checks it).

What it costs. The estimate enters every reply's loss inside a sigmoid, so no micro-batch's
backward can start before every KL row of the step is scored: the pass is a forward of the
policy (and, under kto.reference adapters_off, of the reference) over as many rows as the
step trains, one micro-batch at a time, without gradient and without keeping activations,
before the first backward. TRL runs the same forwards (KTOTrainer.forward's
_compute_kl_logps) inside each batch; here they are a graph of their own (compiled once, one
more compile at the start), and the step's replies are not read twice. Its peak is a
forward's, below the train step's.
"""
from __future__ import annotations

import numpy as np

import mindspore as ms

from ...common.collective import all_reduce_sum
from .replies import INDEX, KL, kl_partners, kl_rows


class KlEstimate:
    """`estimate(micro_batches)` -> the micro-batches with the step's KL in their `extra`.
    `kl_cell`: loss.py KlLogRatios; `kl_reference`: (i, j) -> the reference's log-prob of
    record j's reply after record i's prompt (precomputed), or None (the cell computes it:
    adapters_off); `ranks` > 1: the estimate is averaged over the ranks."""

    def __init__(self, kl_cell, kl_reference, ranks: int = 1):
        self.kl_cell, self.kl_reference, self.ranks = kl_cell, kl_reference, ranks
        self.kl = 0.0  # the last step's estimate, for its metrics

    def __call__(self, micro_batches):
        self.kl = self.step_kl(micro_batches)
        batches = []
        for ids, labels, extra in micro_batches:
            extra = extra.copy()
            extra[:, KL] = self.kl
            batches.append((ids, labels, extra))
        return batches

    def step_kl(self, micro_batches) -> float:
        """max(0, the mean over the step's records of every rank of policy - reference log-probs of their KL rows)."""
        ids, labels, extra = (np.concatenate(parts) for parts in zip(*micro_batches))
        partners = kl_partners(len(ids))
        kl_ids, kl_labels = kl_rows(ids, labels, partners)
        records = extra[:, INDEX].astype(np.int64)
        reference = np.zeros(len(ids), np.float32)
        if self.kl_reference is not None:
            reference[:] = [self.kl_reference[pair] for pair in zip(records.tolist(), records[partners].tolist())]
        rows = len(micro_batches[0][0])  # one graph: the KL pass reads micro-batches of the step's size
        ratios = [self.kl_cell(*map(ms.Tensor, (kl_ids[s:s + rows], kl_labels[s:s + rows], reference[s:s + rows])))
                  .asnumpy() for s in range(0, len(ids), rows)]
        total = np.array([np.concatenate(ratios).sum(), len(ids)], np.float32)
        if self.ranks > 1:  # TRL gathers each device's mean and averages them: equal counts, the same mean
            total = all_reduce_sum(total)
        return max(float(total[0] / total[1]), 0.0)
