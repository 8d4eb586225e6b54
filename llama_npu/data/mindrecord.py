"""Prepared datasets on disk: MindRecord files written with mindspore.mindrecord.FileWriter
and read back through mindspore.dataset.MindDataset, plus meta.json."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterator, List

from ..model.tokens import IGNORE_ID
from .samples import Sample

DATA_FILE = "data.mindrecord"
META_FILE = "meta.json"
COLUMNS = ("input_ids", "labels", "segment_ids")
PAGE_BYTES = 1 << 22
# Rows a file: FileWriter holds its index, about 1.4 KB a row, until commit (measured: 200,000
# rows of 50-400 tokens peaked at 696 MiB written as one file, 489 MiB as files of 50,000;
# 20,000 as one file 445 MiB), so a dataset of any size is written as files of this many rows
# and read as one (MindDataset over the list indexes their rows in order).
ROWS_A_FILE = 65536


def data_files(meta: dict) -> List[str]:
    """The dataset's MindRecord files, in row order (one before files were split)."""
    return meta.get("files", [DATA_FILE])


class RowWriter:
    """New MindRecord files of int32 rows at their own length (`shape: [-1]`) in `directory`,
    written a chunk of flat arrays at a time, a new file once ROWS_A_FILE rows are in one
    (`stem`, `stem`.1, ...; a worker process of prepare-data writes its own stem).

    FileWriter.write_raw_data checks and merges every row in Python (ShardWriter._merge_blob,
    mindspore/mindrecord/core/shardwriter.py), which took longer than tokenizing. Here each
    row's blob is built as _merge_blob builds it (per blob field, in the header's order, its
    byte length as 8 bytes big-endian and its bytes) and the chunk goes to the C++ writer that
    FileWriter.write_raw_data ends in, with the same arguments (no raw fields; the schema is
    ours, so nothing to validate). MindDataset reads the files as it reads FileWriter's."""

    def __init__(self, directory: Path, stem: str = DATA_FILE):
        self.directory = Path(directory)
        self.stem = stem  # the first file's name; the next ones add .1, .2, ...
        self.files: List[str] = []  # written, in row order
        self.file = None
        self.rows = 0
        self.in_file = 0

    def _open(self) -> None:
        from mindspore.mindrecord import FileWriter  # imported here: MindSpore, which read_meta does not need

        if self.file is not None:
            self.file.commit()
        name = self.stem if not self.files else f"{self.stem}.{len(self.files)}"
        path = str(self.directory / name)
        self.file = FileWriter(path, shard_num=1, overwrite=False)
        self.file.add_schema({name: {"type": "int32", "shape": [-1]} for name in COLUMNS}, "llama_npu_samples")
        # The default 32 MB pages made the 230-record sample a 50 MB file; a row of 131,072
        # tokens is 1.5 MB.
        self.file.set_page_size(PAGE_BYTES)
        shard = self.file._writer  # pylint: disable=protected-access
        shard.open([path], False)
        shard.set_shard_header(self.file._header)  # pylint: disable=protected-access
        self.order = list(self.file._header.blob_fields)  # pylint: disable=protected-access
        self.native = shard._writer  # pylint: disable=protected-access
        self.files.append(name)
        self.in_file = 0

    def write(self, columns: Dict[str, "np.ndarray"], starts: "np.ndarray") -> None:
        """Rows starts[i]:starts[i + 1] of each column (name -> flat int32 array)."""
        if len(starts) < 2:
            return
        if self.file is None or self.in_file >= ROWS_A_FILE:
            self._open()
        data = [columns[name].astype("<i4", copy=False).tobytes() for name in self.order]
        bounds = (starts * 4).tolist()
        blobs = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            size = (b - a).to_bytes(8, "big")
            blobs.append(b"".join([part for column in data for part in (size, column[a:b])]))
        self.native.write_raw_data({}, blobs, False, False)
        self.rows += len(blobs)
        self.in_file += len(blobs)

    def commit(self) -> None:
        if self.file is not None:
            self.file.commit()


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

        dataset = ds.MindDataset([str(self.directory / name) for name in data_files(self.meta)],
                                 columns_list=list(COLUMNS),
                                 sampler=ds.SubsetSampler([int(i) for i in indices]))
        for row in dataset.create_dict_iterator(output_numpy=True, num_epochs=1):
            sample = Sample(row["input_ids"].tolist(), row["labels"].tolist(),
                            row["segment_ids"].tolist() if self.packed else None)
            yield window(sample, self.length) if self.length else sample
