"""Tokenized training samples: ids and labels of one record, fitted to the length the
model is trained on."""
from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor
from array import array
from dataclasses import dataclass, field
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..common.console import progress_bar
from ..model.tokens import BOS_ID, EOT_ID, IGNORE_ID
from .chat_template import ROLES, role_headers
from .readers import Record
from .truncation import DEFAULT, CutCounts, file_of, layout, row_cut, take
from .tokenizer import SPECIAL_TOKENS

END_OF_TEXT_ID = SPECIAL_TOKENS["<|end_of_text|>"]  # closes a plain-text document
TOKENIZE_BATCH = 1024  # records per tokenizer call: the Rust tokenizer parallelises a batch


@dataclass
class Sample:
    input_ids: List[int]
    labels: List[int]
    segment_ids: Optional[List[int]] = None  # packed rows: 1..n per sample, 0 for padding


@dataclass
class FitReport:
    cuts: CutCounts = field(default_factory=CutCounts)  # by file: read, truncated, dropped
    lengths: array = field(default_factory=lambda: array("l"))  # before truncation

    read = property(lambda self: self.cuts.total("read"))
    truncated = property(lambda self: self.cuts.total("truncated"))
    dropped = property(lambda self: self.cuts.total("dropped"))
    kept = property(lambda self: self.read - self.dropped)

    def add(self, other: "FitReport") -> None:
        """Count `other`'s records after these (prepare-data's parts, in record order)."""
        self.cuts.add(other.cuts)
        self.lengths.extend(other.lengths)


@dataclass(frozen=True)
class Fitting:
    """How a sample is fitted to a row: `max_len` tokens, data.truncation's `mode`, and the
    assistant's and system's headers a cut finds the turns by (data/truncation.py)."""
    max_len: int
    mode: str
    assistant: Tuple[int, ...] = ()
    system: Tuple[int, ...] = ()

    @classmethod
    def of(cls, tokenizer, max_len: int, mode: str = DEFAULT) -> "Fitting":
        headers = role_headers(tokenizer)
        return cls(max_len, mode, tuple(headers["assistant"]), tuple(headers["system"]))

    def cut(self, ids: Sequence[int], labels: Sequence[int]):
        """(ids, labels) of one sample cut to the row, or None when it is dropped: under
        data.truncation, and when no target token is left (labels[0] never is one)."""
        if len(ids) > self.max_len:
            ranges = row_cut(self.mode, layout(ids, self.assistant, self.system), len(ids), self.max_len)
            if ranges is None:
                return None
            ids, labels = take(ids, ranges), take(labels, ranges)
        if not any(l != IGNORE_ID for l in labels[1:]):
            return None
        return list(ids), list(labels)


@dataclass
class TokenRows:
    """Tokenized samples held flat, as the writer and the packer take them: sample i is
    ids[starts[i]:starts[i + 1]] (and its labels). One array a chunk costs far less than a
    Python list a sample, which is what kept prepare-data below the tokenizer's pace."""
    ids: np.ndarray  # (T,) int32
    labels: np.ndarray  # (T,) int32
    starts: np.ndarray  # (N + 1,) int64

    def __len__(self) -> int:
        return len(self.starts) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.starts)

    def samples(self) -> List[Sample]:
        ids, labels, starts = self.ids.tolist(), self.labels.tolist(), self.starts.tolist()
        return [Sample(ids[a:b], labels[a:b]) for a, b in zip(starts[:-1], starts[1:])]


def _flat(parts: Sequence[Sequence[int]]) -> np.ndarray:
    return np.fromiter(itertools.chain.from_iterable(parts), np.int32, count=sum(map(len, parts)))


def encode_contents(tokenizer, chunk: Sequence[Record]) -> List[List[int]]:
    """The ids of every content string of `chunk` (each record's text, or each turn's), in
    one encode_batch call: the Rust tokenizer spreads a batch over its threads."""
    texts = [t for r in chunk for t in ([r.text] if r.text is not None else [c for _, c in r.messages])]
    # encode_batch_fast: the same ids, without the character offsets nobody here reads
    return [e.ids for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]


def assemble_chunk(headers, chunk: Sequence[Record], content: List[List[int]], train_on_prompt: bool) -> TokenRows:
    """The records' ids and labels, whole, from their contents' ids (encode_contents): in the
    chat format (data/chat_template.py builds the same from lists), or as plain-text
    documents, <|begin_of_text|> text <|end_of_text|>, whose first label stays IGNORE_ID so a
    packed document is never predicted from the one before it."""
    # Every token comes from `source`: the contents, then the constant pieces.
    fixed = {"bos": [BOS_ID], "eot": [EOT_ID], "end": [END_OF_TEXT_ID], **headers}
    at, base = {}, sum(map(len, content))
    for name, ids in fixed.items():
        at[name], base = base, base + len(ids)
    source = np.concatenate([_flat(content), _flat(list(fixed.values()))])
    sizes = {name: len(ids) for name, ids in fixed.items()}
    # A piece: (where in source, tokens, learnt); a record: its pieces in order.
    begin, size, learn, first_piece = [], [], [], []
    offset, turn = 0, 0
    for record in chunk:
        first_piece.append(len(begin))
        begin.append(at["bos"])
        size.append(1)
        learn.append(False)
        if record.text is not None:
            n = len(content[turn])
            begin += [offset, at["end"]]
            size += [n, 1]
            learn += [True, True]
            offset, turn = offset + n, turn + 1
            continue
        for role, _ in record.messages:
            if role not in headers:
                raise ValueError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
            n, learnt = len(content[turn]), role == "assistant" or train_on_prompt
            begin += [at[role], offset, at["eot"]]
            size += [sizes[role], n, 1]
            learn += [False, learnt, learnt]
            offset, turn = offset + n, turn + 1
    size = np.asarray(size, np.int64)
    out_start = np.cumsum(size) - size
    index = np.arange(int(size.sum())) + np.repeat(np.asarray(begin, np.int64) - out_start, size)
    ids = source[index]
    labels = np.where(np.repeat(np.asarray(learn, bool), size), ids, np.int32(IGNORE_ID))
    lengths = np.add.reduceat(size, first_piece) if chunk else np.zeros(0, np.int64)
    return TokenRows(ids, labels, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))


def fit_rows(rows: TokenRows, fitting: Fitting, files: Sequence[str], report: FitReport) -> TokenRows:
    """Every sample fitted to the row (Fitting.cut) and counted in `report` by its file
    (`files`: each sample's). Samples that fit whole are kept or dropped all at once; only
    the longer ones are cut one by one."""
    lengths = rows.lengths
    report.lengths.extend(lengths.tolist())
    position = np.arange(len(rows.ids)) - np.repeat(rows.starts[:-1], lengths)
    target = (rows.labels != IGNORE_ID) & (position >= 1)
    keep = np.add.reduceat(target, rows.starts[:-1]) > 0 if len(rows) else np.zeros(0, bool)
    long = np.flatnonzero(lengths > fitting.max_len)
    cut = [fitting.cut(rows.ids[rows.starts[i]:rows.starts[i + 1]].tolist(),
                       rows.labels[rows.starts[i]:rows.starts[i + 1]].tolist()) for i in long.tolist()]
    keep[long] = [c is not None for c in cut]
    truncated = np.zeros(len(rows), bool)
    truncated[long] = keep[long]
    at = 0
    for path, n in _runs(files):
        report.cuts.count(path, n, int(truncated[at:at + n].sum()), int((~keep[at:at + n]).sum()))
        at += n
    whole = np.repeat(keep & (lengths <= fitting.max_len), lengths)
    ids, labels, kept = [rows.ids[whole]], [rows.labels[whole]], np.where(keep, lengths, 0)
    if len(long):  # rebuilt in order, the cut samples in their places
        ids, labels = [], []
        for i in range(len(rows)):
            a, b = rows.starts[i], rows.starts[i + 1]
            sample = cut[int(np.searchsorted(long, i))] if truncated[i] else (rows.ids[a:b], rows.labels[a:b])
            if keep[i]:
                ids.append(np.asarray(sample[0], np.int32))
                labels.append(np.asarray(sample[1], np.int32))
                kept[i] = len(sample[0])
    flat = (lambda parts: np.concatenate(parts).astype(np.int32)) if ids else (lambda _: np.zeros(0, np.int32))
    return TokenRows(flat(ids), flat(labels), np.concatenate([[0], np.cumsum(kept[keep])]).astype(np.int64))


def _runs(files: Sequence[str]) -> List[Tuple[str, int]]:
    """(file, how many in a row) of a chunk's samples, in order."""
    return [(path, len(list(group))) for path, group in itertools.groupby(files)]


def tokenized_chunks(tokenizer, records: Iterable[Record], fitting: Fitting, train_on_prompt: bool,
                     report: FitReport, bar=None) -> Iterator[TokenRows]:
    """The fitted samples of `records`, TOKENIZE_BATCH records at a time: a stream, so
    nothing but the report grows with the data set. The tokenizer encodes the next chunk in
    a thread (encode_batch releases the GIL) while this one is assembled and consumed."""
    headers = role_headers(tokenizer)
    records = iter(records)
    with ThreadPoolExecutor(1, thread_name_prefix="tokenize") as encoder:
        pending = None
        while True:
            chunk = list(itertools.islice(records, TOKENIZE_BATCH))
            ahead = (chunk, encoder.submit(encode_contents, tokenizer, chunk)) if chunk else None
            if pending is not None:
                done, contents = pending
                rows = assemble_chunk(headers, done, contents.result(), train_on_prompt)
                yield fit_rows(rows, fitting, [file_of(r.where) for r in done], report)
                if bar is not None:
                    bar.update(len(done))
            if ahead is None:
                return
            pending = ahead


def tokenize_records(tokenizer, records: Sequence[Record], max_len: int, train_on_prompt: bool = False,
                     truncation: str = DEFAULT):
    """Samples of at most `max_len` tokens, longer records cut under `truncation`
    (data.truncation), and a report of what was cut or dropped."""
    report, samples, fitting = FitReport(), [], Fitting.of(tokenizer, max_len, truncation)
    with progress_bar(len(records), "tokenize", "record") as bar:
        for rows in tokenized_chunks(tokenizer, records, fitting, train_on_prompt, report, bar):
            samples += rows.samples()
    return samples, report


def pad_batch(samples: Sequence[Sample], length: int, pad_id: int):
    """Right-padded (B, length) int32 arrays: (ids, labels), plus segment ids for packed rows."""
    ids = np.full((len(samples), length), pad_id, dtype=np.int32)
    labels = np.full((len(samples), length), IGNORE_ID, dtype=np.int32)
    segments = np.zeros((len(samples), length), dtype=np.int32)
    for row, sample in enumerate(samples):
        ids[row, :len(sample.input_ids)] = sample.input_ids
        labels[row, :len(sample.labels)] = sample.labels
        if sample.segment_ids is not None:
            segments[row, :len(sample.segment_ids)] = sample.segment_ids
    if samples and samples[0].segment_ids is not None:
        return ids, labels, segments
    return ids, labels


def pad_items(items: Sequence, length: int, pad_id: int):
    """(ids, labels) of items of several rows each (`item.rows`, samples in a fixed order, as
    an objective's pair or labelled reply holds them): the P items' first rows, then their
    second rows, and so on (TRL's concatenated order), right-padded to `length`."""
    return pad_batch([item.rows[r] for r in range(len(items[0].rows)) for item in items], length, pad_id)
