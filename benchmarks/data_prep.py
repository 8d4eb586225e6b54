"""`prepare-data` against the Rust tokenizer's own `encode_batch` on the same records, in one
run: records/s and tokens/s of each, their ratio (goal: 0.7 or more, unpacked and packed),
and the bytes a token on disk. With --peak, also the peak RSS of `prepare-data` itself on
200,000 records and on a tenth of them, each in its own child process (flat memory: the two
peaks are close), and with --workers 2 that of the parent and of its largest worker.

The records are the shipped Chinese sample repeated with a numbered suffix, so their
lengths are realistic. The tokenizer's figure is `encode_batch` on each record's whole chat
text (the markers read as special tokens, so the ids are the ones a sample holds), in
batches of data/samples.py's TOKENIZE_BATCH. `prepare-data`'s covers reading (two passes),
tokenizing, assembling, truncation, packing and the MindRecord write; train's in-memory
tokenizing (data.train_files) is reading the records and tokenize_records. The start-up that a
run pays once (importing MindSpore, loading the tokenizer) is printed, not in the rates.

The rounds alternate between them, each figure the best of --rounds, so that load from
other work on the machine hits them alike. Each line also gives the process's CPU seconds
(all threads): the tokenizer spreads over every core, our Python runs on one. With
--workers N, `prepare-data --workers N` runs too (exactly N parts here, however few the
records). Last, what one process spends a record: the counting pass (one process whatever
--workers says), its Python thread's other work, its tokenizer threads; and from those, the
ratio to expect on a host of more cores with --workers auto, if encode_batch itself scaled
with the cores (an estimate, not a measurement).

    .venv/bin/python benchmarks/data_prep.py [--samples 20000] [--max-seq-len 1024] [--rounds 2] [--workers 2] [--peak]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from child_peak import run_with_peak, run_with_peaks

REPO = Path(__file__).resolve().parent.parent
PEAK_RECORDS = 200_000


def write_records(path: Path, count: int) -> None:
    base = [json.loads(line) for line in (REPO / "data" / "zh_instruct_train.jsonl").read_text("utf-8").splitlines()]
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(count):
            record = dict(base[i % len(base)])
            record["instruction"] = f"{record['instruction']}（第{i}题）"
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")


def timed(run) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds of this process (every thread), of this thread) of run()."""
    wall, cpu, thread = time.perf_counter(), time.process_time(), time.thread_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu, time.thread_time() - thread


def tokenizer_alone(src: Path):
    """(records, the tokens of the last run, a run of encode_batch over the records' chat texts)."""
    from tokenizers import Tokenizer

    from llama_npu.data.chat_template import render_text
    from llama_npu.data.readers import read_records
    from llama_npu.data.samples import TOKENIZE_BATCH
    from llama_npu.data.tokenizer import default_tokenizer_path

    reference = Tokenizer.from_file(str(default_tokenizer_path()))  # markers as special tokens
    texts = [render_text(r.messages) for r in read_records([src], "alpaca")]
    tokens = 0

    def run():
        nonlocal tokens
        tokens = 0
        for start in range(0, len(texts), TOKENIZE_BATCH):
            tokens += sum(len(e.ids) for e in reference.encode_batch(texts[start:start + TOKENIZE_BATCH],
                                                                      add_special_tokens=False))
    return len(texts), lambda: tokens, run


def in_memory(src: Path, max_seq_len: int) -> None:
    """What train does with data.train_files: every record read, then tokenized into samples."""
    from llama_npu.data.readers import read_records
    from llama_npu.data.samples import tokenize_records
    from llama_npu.data.tokenizer import load_tokenizer

    tokenize_records(load_tokenizer(), read_records([src], "alpaca"), max_seq_len + 1)


def count_pass(src: Path) -> None:
    from llama_npu.data.prepare_parts import count_records
    from llama_npu.data.readers import SkipReport
    from llama_npu.data.tables import ReadOptions

    count_records([str(src)], "alpaca", "error", SkipReport(), ReadOptions(), None)


def estimate(records: int, best: dict) -> None:
    """A record's costs in one process, and the ratio they predict on more cores."""
    from llama_npu.data.prepare_parts import AUTO_PARTS, CORES_A_PART

    us = 1e6 / records
    counting = best["counting pass"][2] * us
    alone = best["tokenizer encode_batch"][1] * us
    _, cpu, thread = best["prepare-data unpacked"]
    python, tokenizer = thread * us - counting, (cpu - thread) * us
    print(f"a record, unpacked, one process: counting pass {counting:.1f} us, its Python thread's other work "
          f"{python:.1f} us, its tokenizer threads {tokenizer:.1f} us of CPU (encode_batch alone {alone:.1f} us)")
    cells = []
    for cores in (4, 8, 16, 32, 64):
        parts = max(1, min(AUTO_PARTS, cores // CORES_A_PART))
        ours, one = (counting + max(python / n, (python + tokenizer) / cores) for n in (parts, 1))
        cells.append(f"{cores} cores {alone / cores / ours:.2f} "
                     f"({parts} workers; one process {alone / cores / one:.2f})")
    print("estimated ratio with --workers auto, if encode_batch scaled with the cores: " + ", ".join(cells))


def disk_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if ".mindrecord" in p.name)


def peaks(src: Path, work: Path, max_seq_len: int) -> None:
    """Peak RSS of prepare-data on PEAK_RECORDS records and on a tenth of them, unpacked and packed."""
    small = work / "tenth.jsonl"
    write_records(small, PEAK_RECORDS // 10)
    big = work / "all.jsonl"
    write_records(big, PEAK_RECORDS)
    print(f"peak RSS of prepare-data (child process, VmHWM), max_seq_len {max_seq_len}:")
    for packed in (False, True):
        figures = []
        for path, count in ((small, PEAK_RECORDS // 10), (big, PEAK_RECORDS)):
            out = work / f"peak-{count}-{packed}"
            begin = time.perf_counter()
            code, peak = run_with_peak(["prepare-data", "--format", "alpaca", "--input", path, "--output", out,
                                        "--max-seq-len", max_seq_len, *(["--pack"] if packed else [])],
                                       cwd=REPO, capture_output=True, text=True)
            if code != 0:
                raise SystemExit(f"prepare-data on {count} records failed")
            figures.append(f"{count:,} records {peak / 2**30:.2f} GiB ({time.perf_counter() - begin:.0f} s)")
            shutil.rmtree(out)
        print(f"  {'packed' if packed else 'unpacked':<9} " + ", ".join(figures))
    print(f"with --workers 2 on {PEAK_RECORDS:,} records: the parent's peak RSS and its largest worker's "
          f"(wait4's ru_maxrss):")
    for packed in (False, True):
        out = work / f"peak-workers-{packed}"
        code, own, worker = run_with_peaks(["prepare-data", "--format", "alpaca", "--input", big, "--output", out,
                                            "--max-seq-len", max_seq_len, "--workers", 2,
                                            *(["--pack"] if packed else [])], cwd=REPO, capture_output=True, text=True)
        if code != 0:
            raise SystemExit("prepare-data --workers 2 failed")
        print(f"  {'packed' if packed else 'unpacked':<9} parent {own / 2**30:.2f} GiB, "
              f"a worker {worker / 2**30:.2f} GiB")
        shutil.rmtree(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--max-seq-len", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2, help="each figure is the best of this many runs")
    parser.add_argument("--workers", type=int, default=2, help="also prepare-data --workers N (1: not)")
    parser.add_argument("--peak", action="store_true", help=f"also the peak RSS on {PEAK_RECORDS:,} records")
    args = parser.parse_args()

    begin = time.perf_counter()
    import mindspore  # noqa: F401  (the writer's; once a run)
    imported = time.perf_counter() - begin
    from llama_npu.data import prepare_parts
    from llama_npu.data.prepare import prepare_dataset
    from llama_npu.data.tokenizer import load_tokenizer

    prepare_parts.RECORDS_A_PART = 1  # exactly --workers parts, however few the records

    begin = time.perf_counter()
    load_tokenizer()
    loaded = time.perf_counter() - begin
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        src = work / "generated.jsonl"
        write_records(src, args.samples)
        records, tokens, encode = tokenizer_alone(src)
        threads = os.environ.get("RAYON_NUM_THREADS", f"all {os.cpu_count()}")
        print(f"{records:,} generated alpaca records, max_seq_len {args.max_seq_len}, Llama 3.2 tokenizer "
              f"(its threads: {threads}); start-up once a run, not in the rates: MindSpore import {imported:.1f} s, "
              f"tokenizer load {loaded:.1f} s")
        best = {}
        meta = {}
        for _ in range(args.rounds):
            runs = {"tokenizer encode_batch": encode}
            for workers in sorted({1, args.workers}):
                for packed in (False, True):
                    name = "prepare-data " + ("packed" if packed else "unpacked") + \
                        (f", {workers} workers" if workers > 1 else "")
                    out = work / name.replace(" ", "-").replace(",", "")

                    def run(packed=packed, out=out, name=name, workers=workers):
                        shutil.rmtree(out, ignore_errors=True)
                        meta[name] = prepare_dataset("alpaca", [str(src)], out, max_seq_len=args.max_seq_len,
                                                     packed=packed, workers=workers)
                    runs[name] = run
            runs["train's in-memory tokenizing"] = lambda: in_memory(src, args.max_seq_len)
            runs["counting pass"] = lambda: count_pass(src)
            for name, run in runs.items():
                figures = timed(run)
                if name not in best or figures[0] < best[name][0]:
                    best[name] = figures
        count = tokens()
        for name, (wall, cpu, _) in best.items():
            extra = ""
            if name in meta:
                out = work / name.replace(" ", "-").replace(",", "")
                stored = meta[name]["counts"]["tokens"]
                parts = len({f.split(".mindrecord")[0] for f in meta[name]["files"]})
                extra = (f"  {meta[name]['counts']['rows']:,} rows at their own length, "
                         f"{disk_bytes(out) / stored:.1f} bytes a token on disk, {parts} part(s)")
            rate = "" if name == "counting pass" else f"{count / wall / 1e6:>6.2f} M tokens/s"
            print(f"{name:<36} {records / wall:>8,.0f} records/s {rate:>16}  ({wall:.2f} s, {cpu:.2f} CPU s){extra}")
        ref = best["tokenizer encode_batch"][0]
        for workers in sorted({1, args.workers}):
            suffix = f", {workers} workers" if workers > 1 else ""
            unpacked, packed = best["prepare-data unpacked" + suffix][0], best["prepare-data packed" + suffix][0]
            print(f"ratio prepare-data{suffix.replace(',', '')} / tokenizer throughput: unpacked {ref / unpacked:.2f}, "
                  f"packed {ref / packed:.2f} (goal 0.7)")
        in_memory_wall = best["train's in-memory tokenizing"][0]
        print(f"ratio train's in-memory tokenizing / tokenizer throughput: {ref / in_memory_wall:.2f} (goal 0.7)")
        estimate(records, best)
        if args.peak:
            peaks(src, work, args.max_seq_len)


if __name__ == "__main__":
    main()
