"""Questions per second of `llama-npu eval --task ceval` against lm-eval's own HFLM
(transformers on torch, CPU) on the same requests and the same weights, compile included;
then our figures again from new processes, MindSpore's compile cache warm.

The model is a random Llama 3.2-shaped one written by transformers
(scripts/make_tiny_hf_model.py): hidden --hidden (256), --layers (4), head size 64, four
query heads a KV head, MLP 4 x hidden, the full 128,256-token vocabulary, tied embeddings;
batch --batch-size (8) for both. The questions are the shipped C-Eval sample's, repeated
(--questions 48 192), at --shots 0 and 5.

Ours runs the real command in a child process, its compile cache in a fresh directory of
this run (LLAMA_NPU_COMPILE_CACHE); its time is the command's own `scoring_seconds`
(prompts built, graphs compiled, questions scored; without start-up and model load).
HFLM's is its `loglikelihood` on the requests our prompt builder makes for it (the same
tasks and shots, its own tokenizer from the same tokenizer.json). The log-likelihoods of
all four choices of every question are compared.

This is CPU speed on this machine, not NPU figures (FACTS.md).

    .venv/bin/python benchmarks/exam_throughput.py [--questions 48 192] [--shots 0 5]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "data" / "ceval_sample"
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))


def write_questions(root: Path, count: int) -> None:
    """`count` val questions over the sample's subjects (its rows repeated), and its dev split."""
    import shutil

    shutil.copytree(SAMPLE / "dev", root / "dev")
    subjects = sorted(p.name[: -len("_val.csv")] for p in (SAMPLE / "val").glob("*_val.csv"))
    (root / "val").mkdir(parents=True)
    for i, subject in enumerate(subjects):
        with (SAMPLE / "val" / f"{subject}_val.csv").open(encoding="utf-8") as fh:
            reader = csv.reader(fh)
            header, rows = next(reader), list(reader)
        wanted = count // len(subjects) + (i < count % len(subjects))
        with (root / "val" / f"{subject}_val.csv").open("w", encoding="utf-8", newline="") as fh:
            writer = csv.writer(fh, lineterminator="\n")
            writer.writerow(header)
            writer.writerows([str(n)] + rows[n % len(rows)][1:] for n in range(wanted))


def ours(model: Path, data: Path, shots: int, batch: int, cache: Path, output: Path) -> tuple[float, list]:
    """(scoring seconds, the four log-likelihoods of each question) of `eval --task` in a new process."""
    output.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "-m", "llama_npu", "eval", "--task", "ceval", "--checkpoint", str(model),
                           "--data", str(data), "--shots", str(shots), "--batch-size", str(batch), "--device", "cpu",
                           "--json", "--output", str(output)], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "LLAMA_NPU_COMPILE_CACHE": str(cache), "GLOG_v": "3",
                               "PYTHONPATH": str(REPO)})
    if proc.returncode != 0:
        raise SystemExit(f"eval --task ceval --shots {shots} failed:\n{proc.stderr[-3000:]}")
    records = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    return json.loads(proc.stdout)["scoring_seconds"], [[r["logprobs"][k] for k in "ABCD"] for r in records]


def hflm_scores(lm, data_dir: Path, shots: int) -> tuple[float, list]:
    """(seconds, the four log-likelihoods of each question) of HFLM on our prompts' requests."""
    from llama_npu.evaluation.exams.layouts import read_exam
    from llama_npu.evaluation.exams.run import fit_context
    from llama_npu.evaluation.exams.tasks import build_tasks

    data = read_exam("ceval", data_dir, None, None, shots)
    requests = []
    for subject, task in build_tasks(data).items():
        for index, doc in enumerate(task.eval_docs):
            context, _, _ = fit_context(lm, task, doc, shots, False)
            requests += task.construct_requests(doc=doc, ctx=context, metadata=(subject, index, 1),
                                                apply_chat_template=False)
    begin = time.perf_counter()
    results = lm.loglikelihood(requests, disable_tqdm=True)
    seconds = time.perf_counter() - begin
    values = [ll for ll, _ in results]
    return seconds, [values[i:i + 4] for i in range(0, len(values), 4)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, nargs="+", default=[48, 192])
    parser.add_argument("--shots", type=int, nargs="+", default=[0, 5])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()

    import torch
    import transformers
    from lm_eval.models.huggingface import HFLM
    from make_tiny_hf_model import make_tiny_hf_model

    heads = max(args.hidden // 64, 1)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = work / "model"
        make_tiny_hf_model(model, hidden=args.hidden, layers=args.layers, heads=heads, kv_heads=max(heads // 4, 1),
                           intermediate=4 * args.hidden)
        torch.set_num_threads(os.cpu_count() or 1)
        # Llama 3's own markers: without a tokenizer_config.json transformers would add "<s>" and a
        # pad token past the embedding
        tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(model / "tokenizer.json"),
                                                         bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                                         pad_token="<|eot_id|>")
        lm = HFLM(pretrained=str(model), tokenizer=tokenizer, batch_size=args.batch_size, device="cpu",
                  max_length=2048, add_bos_token=True, dtype="float32")
        print(f"random Llama 3.2-shaped model: hidden {args.hidden}, {args.layers} layers, vocab 128,256; batch "
              f"{args.batch_size}; C-Eval sample questions; CPU, {os.cpu_count()} cores; compile included")
        print(f"{'questions':>9} {'shots':>5} {'HFLM q/s':>9} {'ours q/s':>9} {'ratio':>6} {'max |dlogp|':>11}")
        cache = work / "compile-cache"
        cells = [(q, s) for q in args.questions for s in args.shots]
        for count, shots in cells:
            data = work / f"ceval-{count}"
            if not data.exists():
                write_questions(data, count)
            mine, ours_ll = ours(model, data, shots, args.batch_size, cache, work / "out.jsonl")
            theirs, their_ll = hflm_scores(lm, data, shots)
            gap = max(abs(a - b) for x, y in zip(ours_ll, their_ll) for a, b in zip(x, y))
            print(f"{count:>9} {shots:>5} {count / theirs:>9.2f} {count / mine:>9.2f} {theirs / mine:>5.1f}x "
                  f"{gap:>11.1e}", flush=True)
        print("second run, new processes, compile cache warm:")
        for count, shots in cells:
            mine, _ = ours(model, work / f"ceval-{count}", shots, args.batch_size, cache, work / "out.jsonl")
            print(f"{count:>9} {shots:>5} {'':>9} {count / mine:>9.2f}", flush=True)
        print(f"ratio ours / HFLM: see the ratio column (goal 2x); cache {sum(p.stat().st_size for p in cache.rglob('*') if p.is_file()) / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
