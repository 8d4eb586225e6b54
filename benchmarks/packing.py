"""Padding share and effective (non-padding) tokens per step of two packing strategies on
the shipped sample (data/zh_instruct_train.jsonl, Llama 3.2 tokenizer): rows filled in
arrival order, as llama-npu packed before, and best-fit decreasing
(llama_npu/data/packing.py). Unpacked samples and the floor for any packer that keeps
samples whole (no fewer rows than tokens / row length, nor than samples longer than half
a row, since no two of those share a row) are printed beside them.

A step always computes micro-batch x (max_seq_len + 1) token slots, so the effective
tokens per step is that times (1 - padding share): the throughput gained at equal cost.

    .venv/bin/python benchmarks/packing.py [--max-seq-len 256 1024] [--micro-batch 4]
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def in_order_rows(lengths, length: int) -> int:
    """Rows used by filling one row until the next sample does not fit, then starting another."""
    rows, used = 0, length
    for n in lengths:
        if used + n > length:
            rows, used = rows + 1, 0
        used += n
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--max-seq-len", type=int, nargs="+", default=[256, 512, 1024, 2048],
                        help="sequence lengths to pack for (rows hold max_seq_len + 1 tokens)")
    parser.add_argument("--micro-batch", type=int, default=4, help="rows per step")
    args = parser.parse_args()

    from llama_npu.data.packing import assign_rows
    from llama_npu.data.readers import read_records
    from llama_npu.data.samples import tokenize_records
    from llama_npu.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("llama3.2")
    records = read_records([REPO / "data" / "zh_instruct_train.jsonl"], "alpaca")
    print(f"data/zh_instruct_train.jsonl, {len(records)} records; micro-batch {args.micro_batch} rows a step")
    print(f"{'max_seq_len':>11} {'strategy':<22}{'rows':>6}{'padding':>9}{'tokens/step':>13}")
    for max_seq_len in args.max_seq_len:
        length = max_seq_len + 1
        samples, _ = tokenize_records(tokenizer, records, length)
        lengths = [len(s.input_ids) for s in samples]
        tokens = sum(lengths)
        floor = max(math.ceil(tokens / length), sum(n > length / 2 for n in lengths))
        effective = {}
        for name, rows in (("unpacked", len(samples)), ("in order (before)", in_order_rows(lengths, length)),
                           ("best-fit decreasing", len(assign_rows(lengths, length))), ("floor", floor)):
            padding = 1 - tokens / (rows * length)
            effective[name] = args.micro_batch * length * (1 - padding)
            print(f"{max_seq_len:>11} {name:<22}{rows:>6}{padding:>9.1%}{effective[name]:>13,.0f}")
        print(f"{max_seq_len:>11} ratio best-fit decreasing / in order, effective tokens per step: "
              f"{effective['best-fit decreasing'] / effective['in order (before)']:.2f}")


if __name__ == "__main__":
    main()
