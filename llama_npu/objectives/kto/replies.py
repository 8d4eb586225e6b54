"""KTO's records tokenized, as the run's source, and its KL rows (numpy; records.py reads them).

A record is one row: the prompt's turns and the reply as the closing assistant turn; only the
reply and its <|eot_id|> are targets (not the history's replies), as TRL scores its
completion. The KL rows of a step (kl_rows) give each prompt the reply of the step's
previous record, as trl/trainer/kto_trainer.py _get_kl_dataset rotates a batch's answers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np

from ...common.console import progress_bar
from ...data.chat_template import assemble_chat, role_headers
from ...data.errors import RecordError
from ...data.record_kind import RecordKind
from ...data.samples import TOKENIZE_BATCH, Sample, pad_batch
from ...data.dataset_info import DataInput
from ...data.truncation import DEFAULT, layout, prompt_cut, take
from ...data.source import described, note_cuts, read_records
from ...model.tokens import IGNORE_ID, PAD_ID
from ..dpo.pairs import PairReport
from ..prompt_room import no_room_error
from .records import RECORDS, SKIP_HINT, KtoRecord


@dataclass
class KtoSample:
    sample: Sample  # the prompt's and reply's ids; labels only on the reply and its <|eot_id|>
    desirable: bool

    @property
    def rows(self) -> tuple:  # objectives/reference_pass.py scores an item's rows
        return (self.sample,)


def tokenize_kto(tokenizer, records: Sequence[KtoRecord], max_len: int, truncation: str = DEFAULT,
                 bar: bool = True) -> Tuple[List[KtoSample], PairReport]:
    """Samples of at most `max_len` tokens (data.max_seq_len + 1), in the Llama 3 chat format,
    a longer record cut under `truncation` (data.truncation, as a pair's: the prompt as one
    block under keep_start, LLaMA-Factory's feedback.py)."""
    headers, report, samples = role_headers(tokenizer), PairReport(), []
    with progress_bar(len(records), "tokenize", "reply", enabled=bar) as progress:
        for start in range(0, len(records), TOKENIZE_BATCH):
            chunk = records[start:start + TOKENIZE_BATCH]
            texts = [t for r in chunk for t in [c for _, c in r.prompt] + [r.reply]]
            encoded = iter(e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False))
            for record in chunk:
                contents = [next(encoded) for _ in range(len(record.prompt) + 1)]
                ids, labels = assemble_chat([r for r, _ in record.prompt] + ["assistant"], contents, headers)
                kept = fit_reply(ids, headers, max_len, truncation, record.where, report)
                reply = len(ids) - len(contents[-1]) - 1  # the reply and its <|eot_id|>: the only targets
                labels = [IGNORE_ID] * reply + labels[reply:]
                if kept is not None:
                    samples.append(KtoSample(Sample(take(ids, kept), take(labels, kept)), record.desirable))
            progress.update(len(chunk))
    return samples, report


def fit_reply(ids, headers, max_len: int, truncation: str, where: str, report: PairReport):
    """The kept ranges of a one-reply row (data/truncation.py prompt_cut), or None; counted."""
    lay = layout(ids, headers["assistant"], headers["system"])
    reply = len(ids) - lay.reply
    cut = prompt_cut(truncation, lay, reply, max_len)
    if cut is None and truncation == "keep_prompt":
        report.no_room.append((where, lay.reply))
    report.cuts.count_record(where, cut is not None and len(ids) > max_len, cut is None)
    return None if cut is None else cut[0] + [(lay.reply, lay.reply + cut[1])]


def reply_samples(recipe, tokenizer, inputs: Sequence[DataInput], kind: RecordKind = RECORDS) -> List[KtoSample]:
    """The labelled replies of `inputs`, tokenized to data.max_seq_len + 1 tokens as samples are;
    what data.truncation cut or dropped of each file is noted."""
    d = recipe.data
    samples, report = tokenize_kto(tokenizer, read_records(recipe, inputs, kind), d.max_seq_len + 1, d.truncation)
    if report.no_room and d.on_bad_record == "error":  # the pre-flight lists them all
        raise no_room_error(*report.no_room[0], d.max_seq_len, SKIP_HINT)
    note_cuts(recipe, report.cuts, inputs, "labelled replies")
    if not samples:
        raise RecordError(f"no labelled reply left in {described(inputs)}: all {report.read} were dropped under "
                          f"data.truncation: {d.truncation}; raise data.max_seq_len, or set data.truncation: keep_end")
    return samples


# The third array of a micro-batch: a row's (reference log-prob, desirable, the step's KL, record index).
REFERENCE, DESIRABLE, KL, INDEX = range(4)


class KtoSource:
    """The labelled replies as a BatchStream source (data/batches.py): a micro-batch of B
    records is (ids, labels) (B, T+1) int32 and `extra` (B, 4) float32 (the columns above; the
    KL column is filled by the step, objectives/kto_step.py; the index, exact in float32 below
    2**24 records, finds a precomputed KL reference)."""

    def __init__(self, samples: Sequence[KtoSample]):
        if len(samples) > 1 << 24:
            raise RecordError(f"{len(samples):,} labelled replies: train.objective: kto takes at most {1 << 24:,} "
                              f"records a run in this version; split the data over runs")
        self.samples = samples
        # (N,): the reference's summed reply log-probs; zeros until a reference pass fills them,
        # and under kto.reference adapters_off.
        self.reference = np.zeros(len(samples), np.float32)
        # (i, j) -> the reference's log-prob of record j's reply after record i's prompt (KL rows).
        self.kl_reference: dict = {}

    def __len__(self) -> int:
        return len(self.samples)

    def iterate(self, indices):
        return ((int(i), self.samples[i]) for i in indices)

    def pad(self, picked: Sequence[tuple], length: int):
        indices = np.array([i for i, _ in picked], np.int64)
        ids, labels = pad_batch([s.sample for _, s in picked], length, PAD_ID)
        extra = np.zeros((len(picked), 4), np.float32)
        extra[:, REFERENCE] = self.reference[indices]
        extra[:, DESIRABLE] = [s.desirable for _, s in picked]
        extra[:, INDEX] = indices
        return ids, labels, extra


def reply_span(labels) -> Tuple[int, int]:
    """[start, end) of the one labelled span of a row (its reply and <|eot_id|>)."""
    targets = np.flatnonzero(np.asarray(labels) != IGNORE_ID)
    return int(targets[0]), int(targets[-1]) + 1


def kl_partners(n: int) -> np.ndarray:
    """Whose reply each of a step's n records is paired with for the KL estimate: the
    previous one's (the first takes the last's), _get_kl_dataset's +1 offset."""
    return np.roll(np.arange(n), 1)


def kl_row(ids_i, labels_i, ids_j, labels_j, length: int):
    """(ids, labels) of one KL row, (length,) int32 each: row i's prompt, then row j's reply,
    cut at `length` tokens, right-padded; only the reply's tokens are targets."""
    start, (reply_start, reply_end) = reply_span(labels_i)[0], reply_span(labels_j)
    reply = np.asarray(ids_j[reply_start:reply_end])[:length - start]
    ids = np.full(length, PAD_ID, np.int32)
    labels = np.full(length, IGNORE_ID, np.int32)
    ids[:start] = ids_i[:start]
    ids[start:start + len(reply)] = reply
    labels[start:start + len(reply)] = reply
    return ids, labels


def kl_rows(ids: np.ndarray, labels: np.ndarray, partners: np.ndarray):
    """(ids, labels) of KL rows, (len(partners), T+1) each, from rows (n, T+1): KL row i is
    row i's prompt then the reply of row partners[i] (kl_row)."""
    rows = [kl_row(ids[i], labels[i], ids[j], labels[j], ids.shape[1]) for i, j in enumerate(partners)]
    return np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])
