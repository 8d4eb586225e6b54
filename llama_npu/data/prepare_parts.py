"""prepare-data's work in parts, one a worker process (`--workers`).

One process tokenizes as fast as the Rust tokenizer's threads allow only while its own
Python thread (reading, assembling, writing) keeps up with them; on a host with many cores
it does not. So the records are split into contiguous ranges, one a part. The counting
pass, which runs first in this process and stops at a bad record before anything is
tokenized, notes where every MARK_EVERY-th good record is (file, line, and how many good
records precede it on that line); a part starts reading at its range's mark (JSONL lines
before it are not parsed, a table's rows are), tokenizes its range and writes its own
MindRecord files. Packed, each part spills its samples; the parent joins the spills, places
every sample (the best fit needs all their lengths) and the parts write contiguous ranges of
the packed rows. Files are listed in range order, so the dataset is the same rows in the
same order whatever the number of parts, only cut into files differently.

Worker processes are spawned, not forked: the parent may hold MindSpore's and the
tokenizer's threads, which a fork copies without their owners. With one part everything
runs in this process, as it always did.
"""
from __future__ import annotations

import itertools
import multiprocessing
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from .mindrecord import DATA_FILE, RowWriter
from .packing import gather_rows
from .readers import SkipReport, good_records
from .record_kind import RecordKind
from .samples import FitReport, Fitting, tokenized_chunks
from .tables import ReadOptions
from .tokenizer import load_tokenizer
from .truncation import DEFAULT

PACK_CHUNK = 2048  # packed rows gathered and written at a time
SPILLED = ("input_ids", "labels")
# A part's fixed cost is a process start, MindSpore's import (for the writer) and the
# tokenizer's load, about 1.5 s here: the work of about 50,000 records on a part's 4 cores.
RECORDS_A_PART = 50_000
MARK_EVERY = 1024  # a part's range starts at a multiple of this record
# One process's Python thread (reading, assembling, writing: 30 us a record here) keeps the
# tokenizer's threads (86 us of CPU a record) busy on about 4 cores; the counting pass, one
# process at 5 us a record, bounds what more parts gain (docs/recipes-and-data.md).
CORES_A_PART = 4
AUTO_PARTS = 8
POLL_SECONDS = 0.25


@dataclass(frozen=True)
class Job:
    """What every part reads and writes, the same for all (pickled to each worker)."""
    fmt: str
    inputs: Tuple[str, ...]
    options: ReadOptions
    kind: Optional[RecordKind]
    tokenizer: str
    length: int  # tokens a stored sample or packed row holds at most
    train_on_prompt: bool
    directory: Path  # the staging directory the parts write into
    truncation: str = DEFAULT  # data.truncation


@dataclass
class Written:
    """A part's result: its MindRecord files (in row order), their rows, and, from
    tokenizing, the fit report and the kept samples' lengths."""
    files: List[str] = field(default_factory=list)
    rows: int = 0
    fit: FitReport = field(default_factory=FitReport)
    kept: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


def workers_for(flag: str) -> int:
    """--workers: a number, or auto (one for every CORES_A_PART cores, at most AUTO_PARTS)."""
    if flag != "auto":
        return int(flag)
    return max(1, min(AUTO_PARTS, len(os.sched_getaffinity(0)) // CORES_A_PART))


@dataclass(frozen=True)
class Span:
    """A part's records: good records start:stop, the first at `line` of inputs[file], after
    `skip` good records on that line (a JSON array may hold several on one)."""
    start: int
    stop: int
    file: int
    line: int
    skip: int = 0


def count_records(inputs: Sequence[str], fmt: str, on_bad_record: str, skipped: SkipReport,
                  options: ReadOptions, kind: Optional[RecordKind]) -> Tuple[int, List[Tuple[int, int, int]]]:
    """(good records, (file, line, good records before it on the line) of every
    MARK_EVERY-th); a bad record raises (error) or is counted in `skipped`; a file's unread
    columns are named."""
    count, marks = 0, []
    for index, path in enumerate(inputs):
        last, same = None, 0
        for record in good_records([path], fmt, on_bad_record, skipped, options, kind):
            # this pass bounds --workers: the "file:line" string compared, parsed at marks only
            same = same + 1 if record.where == last else 0
            if count % MARK_EVERY == 0:
                marks.append((index, int(record.where.rsplit(":", 1)[1]), same))
            count, last = count + 1, record.where
    return count, marks


def spans(count: int, marks: Sequence[Tuple[int, int, int]], workers: int) -> List[Span]:
    """Up to `workers` contiguous ranges of the `count` records, each starting at a mark and
    none under RECORDS_A_PART records (one part holds them all when there are few)."""
    parts = max(1, min(workers, count // RECORDS_A_PART))
    first = sorted({len(marks) * k // parts for k in range(parts)})
    starts = [m * MARK_EVERY for m in first] + [count]
    return [Span(a, b, *marks[m]) for m, a, b in zip(first, starts[:-1], starts[1:])] if count else \
        [Span(0, 0, 0, 1)]


def ranges(count: int, parts: int) -> List[Tuple[int, int]]:
    """`parts` contiguous (start, stop) ranges of `count` items, sizes differing by at most one."""
    bounds = [count * k // parts for k in range(parts + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def stem(part: int) -> str:
    """The first file name of a part's rows: one part writes what prepare-data always wrote."""
    return DATA_FILE if part == 0 else f"data-{part}.mindrecord"


def spill_path(directory: Path, part: int, column: str) -> Path:
    return Path(directory) / f".spill-{part}-{column}"


def tokenize_part(job: Job, part: int, span: Span, packed: bool, bar) -> Written:
    """The span's records tokenized and fitted: written as rows, or, packed, spilled to this
    part's spill files for the placement. `bar.update(n)` is told of each chunk."""
    records = itertools.islice(good_records(job.inputs[span.file:], job.fmt, "skip", SkipReport(), job.options,
                                            job.kind, name_unread=False, first_line=span.line),
                               span.skip, span.skip + span.stop - span.start)
    done = Written()
    tokenizer = load_tokenizer(job.tokenizer)
    chunks = tokenized_chunks(tokenizer, records, Fitting.of(tokenizer, job.length, job.truncation),
                              job.train_on_prompt, done.fit, bar)
    lengths = []
    if packed:
        with open(spill_path(job.directory, part, "input_ids"), "wb") as ids, \
                open(spill_path(job.directory, part, "labels"), "wb") as labels:
            for rows in chunks:
                ids.write(rows.ids.tobytes())
                labels.write(rows.labels.tobytes())
                lengths.append(rows.lengths)
    else:
        writer = RowWriter(job.directory, stem(part))
        for rows in chunks:
            writer.write({"input_ids": rows.ids, "labels": rows.labels, "segment_ids": np.ones_like(rows.ids)},
                         rows.starts)
            lengths.append(rows.lengths)
        writer.commit()
        done.files, done.rows = writer.files, writer.rows
    done.kept = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    return done


def join_spills(directory: Path, parts: int) -> dict:
    """The parts' spill files appended into part 0's, in order: column -> the joined file."""
    joined = {}
    for column in SPILLED:
        joined[column] = spill_path(directory, 0, column)
        with open(joined[column], "ab") as out:
            for part in range(1, parts):
                path = spill_path(directory, part, column)
                with open(path, "rb") as src:
                    shutil.copyfileobj(src, out, 1 << 24)
                path.unlink()
    return joined


def write_packed_part(job: Job, part: int, placement: Sequence[Sequence[int]], starts: np.ndarray,
                      bar=None) -> Written:
    """Packed rows `placement` (sample indices each) gathered from the joined spill (sample i
    is tokens starts[i]:starts[i + 1]) and written PACK_CHUNK rows at a time."""
    writer = RowWriter(job.directory, stem(part))
    if placement:
        ids, labels = (np.memmap(spill_path(job.directory, 0, column), np.int32, "r") for column in SPILLED)
        for first in range(0, len(placement), PACK_CHUNK):
            columns, bounds = gather_rows(ids, labels, starts, placement[first:first + PACK_CHUNK])
            writer.write(columns, bounds)
        del ids, labels  # the maps close before the spill files go
    writer.commit()
    return Written(writer.files, writer.rows)


def write_packed(runner: Parts, job: Job, kept: np.ndarray, placement) -> List[Written]:
    """The spilled samples, placed best-fit decreasing (all their lengths known now), written
    as packed rows, a contiguous range of rows a part; the spill files then go."""
    spills = join_spills(job.directory, runner.parts)
    starts = np.concatenate([[0], np.cumsum(kept)])
    written = runner.run(write_packed_part, [(job, k, placement[a:b], starts)
                                             for k, (a, b) in enumerate(ranges(len(placement), runner.parts))])
    for path in spills.values():
        path.unlink()
    return written


class Parts:
    """Runs work(*call, bar) for each call of a list, one call a part: in this process when
    there is one part, else each in a spawned worker process, the processes kept for the
    next list (packing runs two). A part's error stops the others at once (their work would
    be thrown away) and is raised from run()."""

    def __init__(self, parts: int):
        self.parts = parts
        self.pool = self.counter = None

    def __enter__(self) -> "Parts":
        if self.parts > 1:
            context = multiprocessing.get_context("spawn")
            self.counter = context.Value("q", 0)
            threads = max(1, len(os.sched_getaffinity(0)) // self.parts)
            self.pool = context.Pool(self.parts, _start_worker, (self.counter, threads))
        return self

    def __exit__(self, kind, *_) -> None:
        if self.pool is not None:
            if kind is None:
                self.pool.close()
            else:  # also on Ctrl-C: no worker goes on writing into a directory being removed
                self.pool.terminate()
            self.pool.join()

    def run(self, work: Callable, calls: Sequence[tuple], bar=None) -> List[Written]:
        if self.pool is None:
            return [work(*call, bar) for call in calls]
        with self.counter.get_lock():
            self.counter.value = 0
        pending = [self.pool.apply_async(_in_worker, (work, *call)) for call in calls]
        while not all(result.ready() for result in pending):
            for result in pending:
                if result.ready() and not result.successful():
                    result.get()  # raises the part's error
            time.sleep(POLL_SECONDS)
            if bar is not None:
                bar.update(self.counter.value - bar.n)
        return [result.get() for result in pending]


class _SharedCount:
    """A worker's progress: records done, added to the parent's counter."""

    def __init__(self, counter):
        self.counter = counter

    def update(self, n: int) -> None:
        with self.counter.get_lock():
            self.counter.value += n


_PROGRESS: Optional[_SharedCount] = None


def _start_worker(counter, threads: int) -> None:
    global _PROGRESS  # pylint: disable=global-statement
    _PROGRESS = _SharedCount(counter)
    # Ctrl-C reaches the whole process group: the parent stops the workers (Parts.__exit__),
    # which would otherwise each print a KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The tokenizer's threads share the cores among the parts (a user's setting wins); read
    # by the Rust thread pool when it first starts, after this.
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads))


def _in_worker(work: Callable, *call):
    return work(*call, _PROGRESS)
