"""Prepared datasets on disk: MindRecord files written with mindspore.mindrecord.FileWriter
and read back through mindspore.dataset.MindDataset, plus meta.json."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator, Sequence

from ..model.tokens import IGNORE_ID
from .samples import Sample

DATA_FILE = "data.mindrecord"
META_FILE = "meta.json"
COLUMNS = ("input_ids", "labels", "segment_ids")


def write_samples(directory: Path, samples: Sequence[Sample]) -> None:
    import numpy as np  # imported here: numpy and MindSpore, which the pre-flight's read_meta does not need
    from mindspore.mindrecord import FileWriter

    writer = FileWriter(str(Path(directory) / DATA_FILE), shard_num=1, overwrite=False)
    writer.add_schema({name: {"type": "int32", "shape": [-1]} for name in COLUMNS}, "llama_npu_samples")
    rows = [{"input_ids": np.asarray(s.input_ids, np.int32), "labels": np.asarray(s.labels, np.int32),
             # unpacked samples are one segment each
             "segment_ids": np.asarray(s.segment_ids if s.segment_ids is not None else [1] * len(s.input_ids),
                                       np.int32)} for s in samples]
    for start in range(0, len(rows), 10000):
        writer.write_raw_data(rows[start:start + 10000])
    writer.commit()


def read_meta(directory: Path) -> dict:
    path = Path(directory) / META_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{directory}: not a prepared dataset (no {META_FILE}); "
                                f"create one with llama-npu prepare-data")
    return json.loads(path.read_text(encoding="utf-8"))


def window(sample: Sample, length: int) -> Sample:
    """`length` tokens of a longer row around its first target token, so that a short
    window still has targets (a row's first tokens are most often a prompt)."""
    if len(sample.input_ids) <= length:
        return sample
    first = next((i for i, label in enumerate(sample.labels) if label != IGNORE_ID), 0)
    start = max(0, min(first - length // 2, len(sample.input_ids) - length))
    cut = slice(start, start + length)
    return Sample(sample.input_ids[cut], sample.labels[cut],
                  sample.segment_ids[cut] if sample.segment_ids is not None else None)


class MindRecordSamples:
    """A prepared dataset as a sample source: len() and iterate(indices) in a given order,
    streamed by MindDataset with a SubsetSampler (nothing is loaded up front). With
    `length`, rows longer than it are read as a window of it (a rehearsal's short rows)."""

    def __init__(self, directory: Path, length: int = 0):
        self.directory = Path(directory)
        self.meta = read_meta(self.directory)
        self.packed = self.meta["packed"]
        self.count = self.meta["counts"]["rows"]
        self.length = length

    def __len__(self) -> int:
        return self.count

    def iterate(self, indices) -> Iterator[Sample]:
        # imported here: numpy and MindSpore, which the pre-flight's read_meta does not need
        import mindspore.dataset as ds

        dataset = ds.MindDataset(str(self.directory / DATA_FILE), columns_list=list(COLUMNS),
                                 sampler=ds.SubsetSampler([int(i) for i in indices]))
        for row in dataset.create_dict_iterator(output_numpy=True, num_epochs=1):
            sample = Sample(row["input_ids"].tolist(), row["labels"].tolist(),
                            row["segment_ids"].tolist() if self.packed else None)
            yield window(sample, self.length) if self.length else sample
