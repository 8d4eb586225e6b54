"""Peak host memory of scoring preference pairs (`llama-npu eval --data PAIRS` of a DPO run)
against the DPO run that trained on the same pairs, side by side.

Both are the real commands, each in its own child process whose own peak RSS (VmHWM,
benchmarks/child_peak.py) is printed: `train` of a DPO run from a tiny converted
checkpoint on N pairs (cpu_dpo_smoke.yaml's settings: max_seq_len 128, one pair a
micro-batch), then `eval --data` of the same pairs on that run, with eval's defaults.
The goal (#42): eval at most 1.2 times the training run's peak.

This is host memory on MindSpore's CPU backend, not NPU memory (FACTS.md).

    .venv/bin/python benchmarks/pair_eval_memory.py [--pairs 8] [--steps 2]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from child_peak import run_with_peak
from eval_memory import write_checkpoint

REPO = Path(__file__).resolve().parent.parent
GOAL = 1.2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8, help="pairs trained on and scored")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps of the DPO run")
    args = parser.parse_args()
    os.environ.setdefault("GLOG_v", "3")
    lines = (REPO / "data" / "zh_pref_train.jsonl").read_text(encoding="utf-8").splitlines()[:args.pairs]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_checkpoint(work / "tiny")
        pairs = work / "pairs.jsonl"
        pairs.write_text("\n".join(lines) + "\n", encoding="utf-8")
        run = work / "run"
        with open(work / "train.err", "w") as err:
            code, train_peak = run_with_peak(
                ["train", REPO / "recipes" / "cpu_dpo_smoke.yaml", "--output-dir", run,
                 "--set", f"data.train_files=[{pairs}]", "--set", f"model.checkpoint={work / 'tiny'}",
                 "--set", "model.random_init=false", "--set", f"train.max_steps={args.steps}",
                 "--set", f"train.save_every={args.steps}", "--set", "train.global_batch_size=2",
                 "--set", "train.warmup_steps=0"],
                cwd=work, stdout=open(os.devnull, "w"), stderr=err)
            if code != 0:
                raise SystemExit(f"train failed:\n{(work / 'train.err').read_text()[-3000:]}")
        with open(work / "eval.out", "w") as out, open(work / "eval.err", "w") as err:
            code, eval_peak = run_with_peak(["eval", "--checkpoint", run, "--data", pairs, "--device", "cpu", "--json"],
                                            cwd=work, stdout=out, stderr=err)
        if code != 0:
            raise SystemExit(f"eval failed:\n{(work / 'eval.err').read_text()[-3000:]}")
        scored = json.loads((work / "eval.out").read_text().strip().splitlines()[-1])
    ratio = eval_peak / train_peak
    print(f"{args.pairs} preference pairs, tiny model, max_seq_len 128; peak host RSS of each command on the "
          f"MindSpore CPU backend (not NPU memory)")
    print(f"train (DPO, {args.steps} steps of 2 pairs, 1 a micro-batch): {train_peak / 2**30:.2f} GiB")
    print(f"eval --data PAIRS ({scored['pairs']} pairs, policy then reference): {eval_peak / 2**30:.2f} GiB")
    print(f"ratio eval / train: {ratio:.2f} ({'within' if ratio <= GOAL else 'OVER'} the {GOAL} goal)")


if __name__ == "__main__":
    main()
