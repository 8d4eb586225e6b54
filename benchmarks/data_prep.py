"""Samples per second of `prepare-data` on 20,000 generated alpaca records, without and
with packing, measured in one run.

The records are the shipped Chinese sample repeated with a numbered suffix, so their
lengths are realistic. Reading, tokenization (batched through the Rust tokenizer),
truncation, packing and the MindRecord write are all inside the timing.

    .venv/bin/python benchmarks/data_prep.py [--samples 20000] [--max-seq-len 1024]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--max-seq-len", type=int, default=1024)
    args = parser.parse_args()

    from llama_npu.data.prepare import prepare_dataset

    base = [json.loads(line) for line in (REPO / "data" / "zh_instruct_train.jsonl").read_text("utf-8").splitlines()]
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "generated.jsonl"
        with open(src, "w", encoding="utf-8") as fh:
            for i in range(args.samples):
                record = dict(base[i % len(base)])
                record["instruction"] = f"{record['instruction']}（第{i}题）"
                fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        print(f"{args.samples} generated alpaca records, max_seq_len {args.max_seq_len}, Llama 3.2 tokenizer, "
              f"CPU (2 cores here)")
        rates = {}
        for packed in (False, True):
            begin = time.perf_counter()
            meta = prepare_dataset("alpaca", [str(src)], Path(tmp) / f"out-{packed}",
                                   max_seq_len=args.max_seq_len, packed=packed)
            seconds = time.perf_counter() - begin
            rates[packed] = args.samples / seconds
            print(f"{'packed' if packed else 'unpacked':<9} {rates[packed]:>8,.0f} samples/s  "
                  f"({seconds:.1f} s, {meta['counts']['rows']} rows, padding "
                  f"{meta['padding_ratio']['packed' if packed else 'unpacked']:.1%})")
        print(f"ratio packed / unpacked throughput: {rates[True] / rates[False]:.2f}")


if __name__ == "__main__":
    main()
