"""The SFT samples a run trains and evaluates on (objectives/sft.py): a prepared MindRecord
directory, or the raw files read, tokenized (and packed) in memory; and the reading of an
objective's records (its RecordKind), which every objective's source goes through."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence, Union

from ..common.console import note
from .batches import ListSamples
from .mindrecord import MindRecordSamples
from .packing import pack, padding_share
from .readers import RecordError, read_dataset
from .record_kind import RecordKind
from .samples import Sample, tokenize_records
from .tables import ReadOptions


def read_records(recipe, files: Sequence[str], kind: Optional[RecordKind] = None) -> list:
    """The good records of `files` of the objective's `kind`, read with the run's data.columns
    and data.encoding; with data.on_bad_record: skip, the others noted."""
    d = recipe.data
    records, skipped = read_dataset(files, d.format, d.on_bad_record, ReadOptions.of(d.columns, d.encoding), kind)
    if skipped.total:
        note(f"data.on_bad_record=skip: skipped {skipped.total} of {len(records) + skipped.total} records of "
             f"{', '.join(files)}: {skipped.describe()}")
    return records


def _raw_samples(recipe, tokenizer, files: Sequence[str], kind: Optional[RecordKind]):
    """The samples of `files` and their report, whose lines (each file's truncated and
    dropped records) are printed."""
    # A sample holds max_seq_len + 1 tokens: the model sees max_seq_len positions, each
    # predicting the next token.
    d = recipe.data
    samples, report = tokenize_records(tokenizer, read_records(recipe, files, kind), d.max_seq_len + 1,
                                       d.train_on_prompt, d.truncation)
    for line in report.cuts.lines(d.truncation, d.max_seq_len + 1, "records"):
        note(line)
    return samples, report


def eval_samples(recipe, tokenizer, kind: Optional[RecordKind] = None) -> list[Sample]:
    """The held-out samples of data.eval_files ([] without any)."""
    return _raw_samples(recipe, tokenizer, recipe.data.eval_files, kind)[0] if recipe.data.eval_files else []


def training_source(recipe, tokenizer, kind: Optional[RecordKind] = None) -> Union[ListSamples, MindRecordSamples]:
    """The sample source of the training set: a prepared MindRecord directory, or the raw
    files tokenized (and packed) in memory."""
    d = recipe.data
    if d.prepared:
        # its length and tokenizer: preflight.check_prepared; a rehearsal's rows are cut to its length
        source = MindRecordSamples(Path(d.prepared), d.max_seq_len + 1)
        note(f"{len(source)} {'packed rows' if source.packed else 'samples'} from {d.prepared}")
        return source
    note(f"tokenizing {', '.join(d.train_files)}")
    samples, report = _raw_samples(recipe, tokenizer, d.train_files, kind)
    if not samples:  # known only once tokenized: the pre-flight reads records, it does not tokenize them
        raise RecordError(f"no training sample left in {', '.join(d.train_files)}: all {report.read} records were "
                          f"dropped, none has an answer token within {d.max_seq_len + 1} tokens under "
                          f"data.truncation: {d.truncation}; raise data.max_seq_len")
    note(f"{report.kept} training samples")
    if d.pack:
        rows = pack(samples, d.max_seq_len + 1)
        note(f"packed into {len(rows)} rows of {d.max_seq_len + 1} tokens "
             f"({padding_share(sum(len(s.input_ids) for s in samples), len(rows), d.max_seq_len + 1):.1%} "
             f"padding)")
        samples = rows
    return ListSamples(samples)
