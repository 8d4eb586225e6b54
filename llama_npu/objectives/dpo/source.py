"""The training pairs as a BatchStream source (data/batches.py): a micro-batch of P pairs is
one (2P, T+1) batch, the P chosen rows then the P rejected (pairs.py pad_pair_batch), with
the reference's log-probs of those rows as its third array. A pair never splits across
micro-batches, and train.micro_batch_size / global_batch_size count pairs."""
from __future__ import annotations

from typing import Iterator, Optional, Sequence

import numpy as np

from ...data.readers import RecordError
from ...data.record_kind import RecordKind
from ...data.dataset_info import DataInput
from ...data.source import described, note_cuts, read_records
from ...model.tokens import PAD_ID
from ..prompt_room import no_room_error
from .pairs import PairSample, pad_pair_batch, tokenize_pairs
from .records import RECORDS, SKIP_HINT


class PairSource:
    def __init__(self, pairs: Sequence[PairSample], reference: Optional[np.ndarray] = None):
        self.pairs = pairs
        # (N, 2): the reference's summed reply log-probs of each pair's chosen and rejected
        # rows; zeros until a reference pass fills it, and under dpo.reference none or adapters_off.
        self.reference = np.zeros((len(pairs), 2), np.float32) if reference is None else reference

    def __len__(self) -> int:
        return len(self.pairs)

    def iterate(self, indices) -> Iterator[tuple]:
        return ((int(i), self.pairs[i]) for i in indices)

    def pad(self, picked: Sequence[tuple], length: int):
        """(ids, labels, reference): (2P, length) int32 twice and (2P,) float32."""
        indices = [i for i, _ in picked]
        ids, labels = pad_pair_batch([pair for _, pair in picked], length, PAD_ID)
        reference = np.concatenate([self.reference[indices, 0], self.reference[indices, 1]]).astype(np.float32)
        return ids, labels, reference


def pair_samples(recipe, tokenizer, inputs: Sequence[DataInput], kind: RecordKind = RECORDS) -> list[PairSample]:
    """The preference pairs of `inputs`, tokenized to data.max_seq_len + 1 tokens as samples
    are; what data.truncation cut or dropped of each file is noted."""
    d = recipe.data
    pairs, report = tokenize_pairs(tokenizer, read_records(recipe, inputs, kind), d.max_seq_len + 1, d.truncation)
    if report.no_room and d.on_bad_record == "error":  # the pre-flight lists them all
        raise no_room_error(*report.no_room[0], d.max_seq_len, SKIP_HINT)
    note_cuts(recipe, report.cuts, inputs, "preference pairs")
    if not pairs:
        raise RecordError(f"no preference pair left in {described(inputs)}: all {report.read} were dropped under "
                          f"data.truncation: {d.truncation}; raise data.max_seq_len, or set data.truncation: keep_end")
    return pairs
