"""The samples a run trains and evaluates on: a prepared MindRecord directory, or the raw
files read, tokenized (and packed) in memory."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence, Union

from ..common.console import note
from .batches import ListSamples
from .pair_source import PairSource
from .mindrecord import MindRecordSamples
from .packing import pack, padding_share
from .pairs import PAIR_PARSERS, PairSample, no_room_error, tokenize_pairs
from .readers import RecordError, read_dataset
from .samples import Sample, tokenize_records
from .tables import ReadOptions
from .tokenizer import load_tokenizer


def run_samples(recipe) -> tuple[Union[ListSamples, MindRecordSamples], list[Sample]]:
    """(the training set's sample source, the held-out samples), one tokenizer for both.
    A bad record deep in a file stops the run here, before its directory is touched."""
    tokenizer = load_tokenizer(recipe.data.tokenizer)
    if recipe.train.objective == "dpo":  # pairs; a DPO run takes no eval_files (objectives/preference.py)
        return PairSource(pair_samples(recipe, tokenizer, recipe.data.train_files)), []
    return training_source(recipe, tokenizer), eval_samples(recipe, tokenizer)


def _read(recipe, files: Sequence[str], parsers=None) -> list:
    """The good records of `files`, read with the run's data.columns and data.encoding; with
    data.on_bad_record: skip, the others noted."""
    d = recipe.data
    records, skipped = read_dataset(files, d.format, d.on_bad_record, ReadOptions.of(d.columns, d.encoding), parsers)
    if skipped.total:
        note(f"data.on_bad_record=skip: skipped {skipped.total} of {len(records) + skipped.total} records of "
             f"{', '.join(files)}: {skipped.describe()}")
    return records


def _raw_samples(recipe, tokenizer, files: Sequence[str]):
    # A sample holds max_seq_len + 1 tokens: the model sees max_seq_len positions, each
    # predicting the next token.
    return tokenize_records(tokenizer, _read(recipe, files), recipe.data.max_seq_len + 1, recipe.data.train_on_prompt)


def pair_samples(recipe, tokenizer, files: Sequence[str]) -> list[PairSample]:
    """The preference pairs of `files` (train.objective: dpo), tokenized to data.max_seq_len
    + 1 tokens as samples are; what dpo.on_long_pair cut or dropped is noted."""
    d = recipe.data
    pairs, report = tokenize_pairs(tokenizer, _read(recipe, files, PAIR_PARSERS), d.max_seq_len + 1,
                                   recipe.dpo.on_long_pair)
    if report.no_room and d.on_bad_record == "error":  # the pre-flight lists them all
        raise no_room_error(*report.no_room[0], d.max_seq_len)
    note(f"{', '.join(files)}: {report.describe(d.max_seq_len + 1)}")
    if not pairs:
        hint = ", or set dpo.on_long_pair: truncate" if report.dropped else ""
        raise RecordError(f"no preference pair left in {', '.join(files)}: all {report.read} were dropped; raise "
                          f"data.max_seq_len{hint}")
    return pairs


def eval_samples(recipe, tokenizer) -> list[Sample]:
    """The held-out samples of data.eval_files ([] without any)."""
    return _raw_samples(recipe, tokenizer, recipe.data.eval_files)[0] if recipe.data.eval_files else []


def training_source(recipe, tokenizer) -> Union[ListSamples, MindRecordSamples]:
    """The sample source of the training set: a prepared MindRecord directory, or the raw
    files tokenized (and packed) in memory."""
    d = recipe.data
    if d.prepared:
        # its length and tokenizer: preflight.check_prepared; a rehearsal's rows are cut to its length
        source = MindRecordSamples(Path(d.prepared), d.max_seq_len + 1)
        note(f"{len(source)} {'packed rows' if source.packed else 'samples'} from {d.prepared}")
        return source
    note(f"tokenizing {', '.join(d.train_files)}")
    samples, report = _raw_samples(recipe, tokenizer, d.train_files)
    if not samples:  # known only once tokenized: the pre-flight reads records, it does not tokenize them
        raise RecordError(f"no training sample left in {', '.join(d.train_files)}: all {report.read} records were "
                          f"dropped, none has an answer token within {d.max_seq_len + 1} tokens; raise "
                          f"data.max_seq_len")
    note(f"{report.kept} training samples ({report.truncated} truncated, "
         f"{report.dropped_no_answer} dropped: no answer token within {d.max_seq_len + 1} tokens)")
    if d.pack:
        rows = pack(samples, d.max_seq_len + 1)
        note(f"packed into {len(rows)} rows of {d.max_seq_len + 1} tokens "
             f"({padding_share(sum(len(s.input_ids) for s in samples), len(rows), d.max_seq_len + 1):.1%} "
             f"padding)")
        samples = rows
    return ListSamples(samples)
