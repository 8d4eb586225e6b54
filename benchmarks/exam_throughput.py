"""Questions per second of `llama-npu eval --task ceval` against lm-eval's own HFLM
(transformers on torch, CPU) on the same requests and the same weights: each side cold (a
new process: our graphs compiled, HFLM's first call), then ours warm (again in a new
process, MindSpore's compile cache holding the graphs).

The model is a random Llama 3.2-shaped one written by transformers
(scripts/make_tiny_hf_model.py): hidden --hidden (256), --layers (4), head size 64, four
query heads a KV head, MLP 4 x hidden, the full 128,256-token vocabulary, tied embeddings;
batch --batch-size (8) for both. The questions are the shipped C-Eval sample's rows,
repeated and numbered so that every prompt differs (--questions 48 192), at --shots 0 and 5.

Ours runs the real command in a child process, its compile cache in a fresh directory of
each cell (LLAMA_NPU_COMPILE_CACHE); its time is the command's own `scoring_seconds`
(prompts built, graphs compiled, questions scored; without start-up and model load).
HFLM's is our prompt builder's run for it (the same tasks and shots, its own tokenizer from
the same tokenizer.json) and its `loglikelihood` on those requests, in a child process of
its own for each cell (without start-up and model load either): both sides build the same
prompts through the same lm-eval task code. The log-likelihoods of all four
choices of every question are compared. The load average is printed before and after: on a
shared host the figures move with it.

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
    """`count` val questions over the sample's subjects, and its dev split. The sample's rows
    are repeated, each numbered ("（7）...") so that every prompt differs: both scorers run
    one forward for identical requests, and repeated rows would measure only their fixed costs."""
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
            writer.writerows([str(n), f"（{n + 1}）{rows[n % len(rows)][1]}"] + rows[n % len(rows)][2:]
                             for n in range(wanted))


def ours(model: Path, data: Path, shots: int, batch: int, cache: Path, output: Path) -> tuple[dict, list]:
    """({scoring, compile, start-up seconds}, the four log-likelihoods of each question) of
    `eval --task` in a new process; start-up is the rest of the process's time (imports,
    model build, checkpoint load), left out of both scorers' figures."""
    output.unlink(missing_ok=True)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "llama_npu", "eval", "--task", "ceval", "--checkpoint", str(model),
                           "--data", str(data), "--shots", str(shots), "--batch-size", str(batch), "--device", "cpu",
                           "--json", "--output", str(output)], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "LLAMA_NPU_COMPILE_CACHE": str(cache), "GLOG_v": "3",
                               "PYTHONPATH": str(REPO)})
    if proc.returncode != 0:
        raise SystemExit(f"eval --task ceval --shots {shots} failed:\n{proc.stderr[-3000:]}")
    wall = time.perf_counter() - started
    records = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    summary = json.loads(proc.stdout)
    seconds = {"scoring": summary["scoring_seconds"], "compile": summary["compile_seconds"],
               "start-up": wall - summary["scoring_seconds"]}
    return seconds, [[r["logprobs"][k] for k in "ABCD"] for r in records]


def hflm_scores(lm, data_dir: Path, shots: int) -> tuple[float, list]:
    """(seconds, the four log-likelihoods of each question) of HFLM on our prompts' requests.
    Its time counts from the prompts' building, as ours does (the same lm-eval task code
    through its own tokenizer), to the last log-likelihood."""
    from llama_npu.evaluation.exams.layouts import read_exam
    from llama_npu.evaluation.exams.run import fit_context
    from llama_npu.evaluation.exams.tasks import build_tasks

    tasks = build_tasks(read_exam("ceval", data_dir, None, None, shots))
    begin = time.perf_counter()
    requests = []
    for subject, task in tasks.items():
        for index, doc in enumerate(task.eval_docs):
            context, _, _ = fit_context(lm, task, doc, shots, False)
            requests += task.construct_requests(doc=doc, ctx=context, metadata=(subject, index, 1),
                                                apply_chat_template=False)
    results = lm.loglikelihood(requests, disable_tqdm=True)
    seconds = time.perf_counter() - begin
    values = [ll for ll, _ in results]
    return seconds, [values[i:i + 4] for i in range(0, len(values), 4)]


def hflm_cell(model: Path, data: Path, shots: int, batch: int) -> tuple[float, list]:
    """hflm_scores in a new process (HFLM cold, as ours is)."""
    proc = subprocess.run([sys.executable, __file__, "--hflm-cell", str(model), str(data), str(shots), str(batch)],
                          cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    if proc.returncode != 0:
        raise SystemExit(f"HFLM --shots {shots} failed:\n{proc.stderr[-3000:]}")
    seconds, values = json.loads(proc.stdout.splitlines()[-1])
    return seconds, values


def run_hflm_cell(model: Path, data: Path, shots: int, batch: int) -> None:
    import torch
    import transformers
    from lm_eval.models.huggingface import HFLM

    torch.set_num_threads(os.cpu_count() or 1)
    # Llama 3's own markers: without a tokenizer_config.json transformers would add "<s>" and a
    # pad token past the embedding
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(model / "tokenizer.json"),
                                                     bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                                     pad_token="<|eot_id|>")
    lm = HFLM(pretrained=str(model), tokenizer=tokenizer, batch_size=batch, device="cpu", max_length=2048,
              add_bos_token=True, dtype="float32")
    print(json.dumps(hflm_scores(lm, data, shots)))


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + " (1, 5, 15 min)"


def main() -> None:
    if sys.argv[1:2] == ["--hflm-cell"]:
        model, data, shots, batch = sys.argv[2:6]
        return run_hflm_cell(Path(model), Path(data), int(shots), int(batch))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, nargs="+", default=[48, 192])
    parser.add_argument("--shots", type=int, nargs="+", default=[0, 5])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()

    from make_tiny_hf_model import make_tiny_hf_model

    heads = max(args.hidden // 64, 1)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = work / "model"
        make_tiny_hf_model(model, hidden=args.hidden, layers=args.layers, heads=heads, kv_heads=max(heads // 4, 1),
                           intermediate=4 * args.hidden)
        print(f"random Llama 3.2-shaped model: hidden {args.hidden}, {args.layers} layers, vocab 128,256; batch "
              f"{args.batch_size}; C-Eval sample questions, each prompt distinct; CPU, {os.cpu_count()} cores")
        print(f"before: {load()}")
        print(f"{'questions':>9} {'shots':>5} {'HFLM q/s':>9} {'ours cold':>9} {'ratio':>6} {'ours warm':>9} "
              f"{'ratio':>6} {'max |dlogp|':>11}   ours cold: compile / scoring / start-up s")
        for count in args.questions:
            for shots in args.shots:
                data = work / f"ceval-{count}"
                if not data.exists():
                    write_questions(data, count)
                theirs, their_ll = hflm_cell(model, data, shots, args.batch_size)
                cache = work / f"compile-cache-{count}-{shots}"  # cold: its own, empty
                cold, ours_ll = ours(model, data, shots, args.batch_size, cache, work / "out.jsonl")
                warm, _ = ours(model, data, shots, args.batch_size, cache, work / "out.jsonl")
                gap = max(abs(a - b) for x, y in zip(ours_ll, their_ll) for a, b in zip(x, y))
                print(f"{count:>9} {shots:>5} {count / theirs:>9.2f} {count / cold['scoring']:>9.2f} "
                      f"{theirs / cold['scoring']:>5.1f}x {count / warm['scoring']:>9.2f} "
                      f"{theirs / warm['scoring']:>5.1f}x {gap:>11.1e}   {cold['compile']:.1f} / "
                      f"{cold['scoring']:.1f} / {cold['start-up']:.1f}", flush=True)
        print(f"after: {load()}")
        print(f"goal: ours / HFLM >= 2x in every cell, cold; compile caches "
              f"{sum(p.stat().st_size for p in work.glob('compile-cache-*/**/*') if p.is_file()) / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
