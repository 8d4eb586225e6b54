"""The SFT samples a run trains and evaluates on (objectives/sft.py): a prepared MindRecord
directory, or the raw files read, tokenized (and packed) in memory; and the reading of an
objective's records (its RecordKind), which every objective's source goes through."""
from __future__ import annotations

from pathlib import Path
from dataclasses import replace
from typing import Dict, Optional, Sequence, Union

from ..common.console import note
from .batches import ListSamples
from .dataset_info import DataInput, eval_inputs, sampled, train_inputs
from .mindrecord import MindRecordSamples
from .packing import pack, padding_share
from .readers import RecordError, SkipReport, detect_format, good_records, read_dataset
from .record_kind import RecordKind
from .samples import Sample, tokenize_records
from .tables import ReadOptions
from .truncation import CutCounts


def read_records(recipe, inputs: Sequence[DataInput], kind: Optional[RecordKind] = None,
                 rehearsing: bool = False) -> list:
    """The good records of `inputs` (data/dataset_info.py: data.train_files, or data.dataset's
    entries) of the objective's `kind`, each read with its own options (data.columns, tags,
    encoding; an entry's num_samples and data.max_samples applied); with data.on_bad_record:
    skip, the others noted. `rehearsing`: a rehearsal's look at the lengths, skipping quietly."""
    d, records = recipe.data, []
    for data_input in inputs:
        read, skipped = read_dataset(data_input.files, data_input.format, "skip" if rehearsing else d.on_bad_record,
                                     data_input.options, kind)
        if skipped.total and not rehearsing:
            note(f"data.on_bad_record=skip: skipped {skipped.total} of {len(read) + skipped.total} records of "
                 f"{data_input.describe()}: {skipped.describe()}")
        records += sampled(read, data_input, d.max_samples, recipe.train.seed)
    return records


def read_files(files: Sequence[str], options: ReadOptions, on_bad_record: str, kind: Optional[RecordKind]) -> list:
    """The good records of eval --data's files, each in the format its keys give, read as
    train reads them (`options`: the run's); with on_bad_record skip, the others counted and
    the first few named, as train does."""
    records, skipped = [], SkipReport()
    for path in files:
        records += good_records([path], detect_format(Path(path), options), on_bad_record, skipped, options, kind)
    if skipped.total:
        note(f"--on-bad-record skip: skipped {skipped.total} of {len(records) + skipped.total} records of "
             f"{', '.join(map(str, files))}: {skipped.describe()}")
    return records


def described(inputs: Sequence[DataInput]) -> str:
    """The inputs as messages name them."""
    return ", ".join(data_input.describe() for data_input in inputs)


def file_names(inputs: Sequence[DataInput]) -> Dict[str, str]:
    """Each file of `inputs` as the per-file truncation lines name it: its entry's name with
    it (DataInput.describe), or the path alone for data.train_files."""
    return {path: replace(data_input, files=(path,)).describe() for data_input in inputs for path in data_input.files}


def note_cuts(recipe, cuts: CutCounts, inputs: Sequence[DataInput], what: str) -> None:
    """The start's line per file: how many of its `what` data.truncation cut and dropped."""
    d = recipe.data
    for line in cuts.lines(d.truncation, d.max_seq_len + 1, what, file_names(inputs)):
        note(line)


def _raw_samples(recipe, tokenizer, inputs: Sequence[DataInput], kind: Optional[RecordKind]):
    """The samples of `inputs` and their report, whose lines (each file's truncated and
    dropped records) are printed."""
    # A sample holds max_seq_len + 1 tokens: the model sees max_seq_len positions, each
    # predicting the next token.
    d = recipe.data
    samples, report = tokenize_records(tokenizer, read_records(recipe, inputs, kind), d.max_seq_len + 1,
                                       d.train_on_prompt, d.truncation)
    note_cuts(recipe, report.cuts, inputs, "records")
    return samples, report


def eval_samples(recipe, tokenizer, kind: Optional[RecordKind] = None) -> list[Sample]:
    """The held-out samples of data.eval_files or data.eval_dataset ([] without any)."""
    inputs = eval_inputs(recipe)
    return _raw_samples(recipe, tokenizer, inputs, kind)[0] if inputs else []


def training_source(recipe, tokenizer, kind: Optional[RecordKind] = None) -> Union[ListSamples, MindRecordSamples]:
    """The sample source of the training set: a prepared MindRecord directory, or the raw
    files tokenized (and packed) in memory."""
    d = recipe.data
    if d.prepared:
        # its length and tokenizer: preflight.check_prepared; a rehearsal's rows are cut to its length
        source = MindRecordSamples(Path(d.prepared), d.max_seq_len + 1)
        note(f"{len(source)} {'packed rows' if source.packed else 'samples'} from {d.prepared}")
        return source
    inputs = train_inputs(recipe)
    note(f"tokenizing {described(inputs)}")
    samples, report = _raw_samples(recipe, tokenizer, inputs, kind)
    if not samples:  # known only once tokenized: the pre-flight reads records, it does not tokenize them
        raise RecordError(f"no training sample left in {described(inputs)}: all {report.read} records were "
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
