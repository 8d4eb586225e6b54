"""`llama-npu prepare-data`: raw alpaca / ShareGPT / text files -> a MindRecord directory
with meta.json.

The directory appears only when complete: everything is written into a temporary sibling
and renamed into place, so a failed run never leaves half a dataset, and --overwrite swaps
the old one out only after the new one is whole.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import List, Optional

import numpy as np

from ..common.atomic import check_writable, staged_directory
from ..common.checksums import write_manifest
from ..common.console import progress_bar
from .chat_template import TEMPLATES
from .mindrecord import META_FILE
from .packing import assign_rows, padding_share
from .prepare_parts import Job, Parts, count_records, spans, tokenize_part, write_packed
from .readers import RecordError, SkipReport
from .record_kind import RecordKind
from .samples import FitReport
from .tables import ReadOptions
from .tokenizer import load_tokenizer, tokenizer_identity
from .truncation import DEFAULT


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def prepare_dataset(fmt: str, inputs: List[str], output: Path, tokenizer: str = "llama3.2",
                    max_seq_len: int = 2048, packed: bool = False, on_bad_record: str = "error",
                    overwrite: bool = False, train_on_prompt: bool = False, progress=None,
                    options: ReadOptions = ReadOptions(), kind: Optional[RecordKind] = None,
                    workers: int = 1, truncation: str = DEFAULT) -> dict:
    """Write the prepared dataset and return its meta.json content. `kind`: the SFT records
    refusing other objectives' by name (objectives/ records_of; the readers' default else).

    `max_seq_len` is the sequence length the model sees, as in a recipe's data.max_seq_len;
    each stored sample (or packed row) holds up to max_seq_len + 1 tokens, a longer record
    cut under `truncation` (data.truncation).

    The records stream through in chunks (data/samples.py tokenized_chunks), so memory does
    not grow with them: a first pass counts them and finds a bad one before anything is
    tokenized, the second tokenizes and writes, in up to `workers` processes
    (data/prepare_parts.py). Packing keeps one length a sample for its best-fit placement and
    the tokens in a spill file beside the output.
    """
    output = Path(output)
    if output.exists() and not overwrite:
        raise FileExistsError(f"output directory {output} exists; pass --overwrite to replace it")
    check_writable(output, "--output")
    if not inputs:
        raise RecordError("no input files given")
    load_tokenizer(tokenizer)  # a bad --tokenizer is refused before the records are read
    length = max_seq_len + 1

    skipped = SkipReport()
    count, marks = count_records(inputs, fmt, on_bad_record, skipped, options, kind)
    parts = spans(count, marks, workers)
    if progress:
        progress(f"tokenizing {count} records, written as {'packed rows' if packed else 'samples'} as they come"
                 + (f", in {len(parts)} worker processes" if len(parts) > 1 else ""))
    output.parent.mkdir(parents=True, exist_ok=True)
    with staged_directory(output, replace=overwrite) as staging:
        job = Job(fmt, tuple(map(str, inputs)), options, kind, tokenizer, length, train_on_prompt, staging,
                  truncation)
        with Parts(len(parts)) as runner:
            with progress_bar(count, "tokenize", "record") as bar:
                written = runner.run(tokenize_part, [(job, k, span, packed) for k, span in enumerate(parts)], bar)
            fit = FitReport()
            for part in written:
                fit.add(part.fit)
            kept = np.concatenate([part.kept for part in written])
            placement = assign_rows(kept.tolist(), length)
            if packed:
                written = write_packed(runner, job, kept, placement)
        files = [name for part in written for name in part.files]
        rows = sum(part.rows for part in written)
        if not rows:
            raise _nothing_left(inputs, fit, skipped)
        meta = _meta(fmt, inputs, tokenizer, max_seq_len, packed, train_on_prompt, fit, skipped, kept, rows,
                     len(placement))
        meta["truncation"] = truncation
        meta["files"] = files
        (staging / META_FILE).write_text(json.dumps(meta, indent=2, ensure_ascii=False), encoding="utf-8")
        write_manifest(staging, "prepare-data")  # train checks every file by it before reading a row
    return meta


def _nothing_left(inputs, fit: FitReport, skipped: SkipReport) -> RecordError:
    why = ""
    if skipped.by_reason:  # the commonest reason, e.g. a ShareGPT file read as alpaca
        reason, entry = max(skipped.by_reason.items(), key=lambda item: item[1]["count"])
        why = f"; most skipped as {reason} (first at {entry['first'][0]})"
    return RecordError(f"no sample left to write from {', '.join(map(str, inputs))} "
                       f"(read {fit.read + skipped.total}, skipped {skipped.total}, dropped {fit.dropped}){why}")


def _meta(fmt, inputs, tokenizer, max_seq_len, packed, train_on_prompt, fit, skipped, kept, rows, packed_rows):
    length = max_seq_len + 1
    lengths = np.asarray(fit.lengths) if len(fit.lengths) else np.zeros(1, np.int64)
    tokens = int(kept.sum())
    return {
        "format": fmt, "template": TEMPLATES[0], "max_seq_len": max_seq_len, "packed": packed, "train_on_prompt": train_on_prompt,
        "counts": {"read": fit.read + skipped.total, "written": fit.kept, "skipped": skipped.total,
                   "dropped": fit.dropped, "truncated": fit.truncated, "rows": rows,
                   "tokens": tokens},
        "skipped_by_reason": skipped.by_reason,
        "token_lengths": {"p50": int(np.percentile(lengths, 50)), "p95": int(np.percentile(lengths, 95)),
                          "max": int(lengths.max()), "note": "tokens per sample before truncation"},
        # training pads every row to max_seq_len + 1 (one compiled shape); the file does not
        "padding_ratio": {"unpacked": padding_share(tokens, len(kept), length),
                          "packed": padding_share(tokens, packed_rows, length),
                          "note": "share of the training batches' slots, each row padded to max_seq_len + 1; "
                                  "rows are stored at their own length"},
        "tokenizer": tokenizer_identity(tokenizer),
        # absolute: a rehearsal reads them from wherever it runs
        "sources": [{"path": str(Path(p).absolute()), "sha256": _sha256(Path(p))} for p in inputs],
    }


def _padding_line(meta: dict) -> str:
    share, length = meta["padding_ratio"], meta["max_seq_len"] + 1
    mine, other = ("packed", "unpacked") if meta["packed"] else ("unpacked", "packed")
    return (f"stored at their own length: {meta['counts']['tokens']:,} tokens; training pads each row to {length} "
            f"tokens, {share[mine]:.1%} of its slots padding ({share[other]:.1%} {other})")


def format_report(meta: dict) -> str:
    c = meta["counts"]
    lines = [f"read {c['read']}: written {c['written']}, skipped {c['skipped']}, dropped {c['dropped']}, "
             f"truncated {c['truncated']} (data.truncation: {meta['truncation']}, rows of {meta['max_seq_len'] + 1} "
             f"tokens)",
             f"{c['rows']} {'packed rows' if meta['packed'] else 'samples'}; tokens per sample p50 "
             f"{meta['token_lengths']['p50']}, p95 {meta['token_lengths']['p95']}, max {meta['token_lengths']['max']}",
             _padding_line(meta)]
    for reason, entry in meta["skipped_by_reason"].items():
        lines.append(f"skipped {entry['count']} x {reason} (first at {', '.join(entry['first'])})")
    return "\n".join(lines)
