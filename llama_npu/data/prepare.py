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
from typing import List

import numpy as np

from ..common.atomic import check_writable, staged_directory
from .mindrecord import META_FILE, write_samples
from .packing import assign_rows, pack, padding_share
from .readers import RecordError, read_dataset
from .samples import tokenize_records
from .tables import ReadOptions
from .tokenizer import load_tokenizer, tokenizer_identity


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def prepare_dataset(fmt: str, inputs: List[str], output: Path, tokenizer: str = "llama3.2",
                    max_seq_len: int = 2048, packed: bool = False, on_bad_record: str = "error",
                    overwrite: bool = False, train_on_prompt: bool = False, progress=None,
                    options: ReadOptions = ReadOptions()) -> dict:
    """Write the prepared dataset and return its meta.json content.

    `max_seq_len` is the sequence length the model sees, as in a recipe's data.max_seq_len;
    each stored sample (or packed row) holds up to max_seq_len + 1 tokens.
    """
    output = Path(output)
    if output.exists() and not overwrite:
        raise FileExistsError(f"output directory {output} exists; pass --overwrite to replace it")
    check_writable(output, "--output")
    if not inputs:
        raise RecordError("no input files given")
    tok = load_tokenizer(tokenizer)
    length = max_seq_len + 1

    records, skipped = read_dataset(inputs, fmt, on_bad_record, options)
    if progress:
        progress(f"tokenizing {len(records)} records")
    samples, fit = tokenize_records(tok, records, length, train_on_prompt)
    rows = pack(samples, length) if packed else samples
    packed_rows = len(rows) if packed else len(assign_rows([len(s.input_ids) for s in samples], length))
    if not rows:
        why = ""
        if skipped.by_reason:  # the commonest reason, e.g. a ShareGPT file read as alpaca
            reason, entry = max(skipped.by_reason.items(), key=lambda item: item[1]["count"])
            why = f"; most skipped as {reason} (first at {entry['first'][0]})"
        raise RecordError(f"no sample left to write from {', '.join(map(str, inputs))} "
                          f"(read {fit.read + skipped.total}, skipped {skipped.total}, "
                          f"dropped {fit.dropped_no_answer}){why}")

    lengths = np.asarray(fit.lengths or [0])
    meta = {
        "format": fmt, "max_seq_len": max_seq_len, "packed": packed, "train_on_prompt": train_on_prompt,
        "counts": {"read": fit.read + skipped.total, "written": fit.kept, "skipped": skipped.total,
                   "dropped_no_answer": fit.dropped_no_answer, "truncated": fit.truncated, "rows": len(rows)},
        "skipped_by_reason": skipped.by_reason,
        "token_lengths": {"p50": int(np.percentile(lengths, 50)), "p95": int(np.percentile(lengths, 95)),
                          "max": int(lengths.max()), "note": "tokens per sample before truncation"},
        "padding_ratio": {"unpacked": padding_share(samples, len(samples), length),
                          "packed": padding_share(samples, packed_rows, length)},
        "tokenizer": tokenizer_identity(tokenizer),
        # absolute: a rehearsal reads them from wherever it runs
        "sources": [{"path": str(Path(p).absolute()), "sha256": _sha256(Path(p))} for p in inputs],
    }

    output.parent.mkdir(parents=True, exist_ok=True)
    with staged_directory(output, replace=overwrite) as staging:
        if progress:
            progress(f"writing {len(rows)} {'packed rows' if packed else 'samples'} to MindRecord")
        write_samples(staging, rows)
        (staging / META_FILE).write_text(json.dumps(meta, indent=2, ensure_ascii=False), encoding="utf-8")
    return meta


def _padding_line(meta: dict) -> str:
    share, rows, length = meta["padding_ratio"], meta["counts"]["rows"], meta["max_seq_len"] + 1
    other = "unpacked" if meta["packed"] else "with --pack"
    return (f"padding: {share['packed' if meta['packed'] else 'unpacked']:.1%} of the {rows} rows x {length} "
            f"tokens written ({share['unpacked' if meta['packed'] else 'packed']:.1%} {other})")


def format_report(meta: dict) -> str:
    c = meta["counts"]
    lines = [f"read {c['read']}: written {c['written']}, skipped {c['skipped']}, "
             f"dropped {c['dropped_no_answer']} (no answer token within {meta['max_seq_len'] + 1} tokens); "
             f"{c['truncated']} truncated",
             f"{c['rows']} {'packed rows' if meta['packed'] else 'samples'}; tokens per sample p50 "
             f"{meta['token_lengths']['p50']}, p95 {meta['token_lengths']['p95']}, max {meta['token_lengths']['max']}",
             _padding_line(meta)]
    for reason, entry in meta["skipped_by_reason"].items():
        lines.append(f"skipped {entry['count']} x {reason} (first at {', '.join(entry['first'])})")
    return "\n".join(lines)
