"""Peak host memory of `llama-npu eval` with its defaults (--max-seq-len 2048, --batch-size 4).

Two inputs, each evaluated by the real command in its own child process, whose peak RSS
(its own VmHWM, benchmarks/child_peak.py) is printed: three short texts, and one record of 2048 tokens. The
model is the tiny preset with Llama 3.2's full 128,256-token vocabulary (8.3M parameters,
nearly all in the embedding), the size at which the fixed padding of every record to 2048
tokens x batch 4 was killed at 24 GB (issue 16; not re-measured: it would take the machine
down). The first figure must stay under 4 GB.

This is host memory on MindSpore's CPU backend, not NPU memory (FACTS.md).

    .venv/bin/python benchmarks/eval_memory.py [--long-tokens 2048]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from child_peak import run_with_peak

REPO = Path(__file__).resolve().parent.parent
SHORT_TEXTS = ["长江是中国最长的河流。", "Llama 3.2 有 1B 和 3B 两个版本。", "今天天气很好，我们去公园散步吧。"]
LIMIT_BYTES = 4 * 2**30


def write_checkpoint(directory: Path) -> None:
    """A converted directory of the tiny preset with random weights (what eval reads)."""
    import numpy as np

    import mindspore as ms

    from llama_npu.model.architecture import PRESETS
    from llama_npu.weights.pretrained import expected_tensors

    shape = PRESETS["tiny"]
    rng = np.random.default_rng(0)
    params = [{"name": name, "data": ms.Tensor((0.02 * rng.standard_normal(dims)).astype(np.float32))}
              for name, dims in expected_tensors(shape).items()]
    directory.mkdir(parents=True)
    ms.save_checkpoint(params, str(directory / "model.ckpt"))
    (directory / "config.json").write_text(json.dumps({"format": "llama-npu", "shape": shape.__dict__,
                                                       "dtype": "float32", "hf_config": None}))


def long_text(tokens: int) -> str:
    """A text of at least `tokens` Llama 3.2 tokens (eval truncates it to --max-seq-len)."""
    from llama_npu.data.tokenizer import load_tokenizer

    tokenizer, text = load_tokenizer("llama3.2"), ""
    while len(tokenizer.encode(text, add_special_tokens=False).ids) < tokens:
        text += "黄河发源于青海省，流经九个省区，最后注入渤海。"
    return text


def peak_rss_of_eval(checkpoint: Path, texts: list, work: Path, name: str) -> tuple[int, dict]:
    data = work / f"{name}.jsonl"
    data.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
    out, err = work / f"{name}.out", work / f"{name}.err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        code, peak = run_with_peak(["eval", "--checkpoint", checkpoint, "--data", data, "--device", "cpu", "--json"],
                                   cwd=REPO, stdout=stdout, stderr=stderr)
    if code != 0:
        raise SystemExit(f"eval on {name} failed:\n{err.read_text()[-3000:]}")
    return peak, json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long-tokens", type=int, default=2048, help="tokens of the long record")
    args = parser.parse_args()
    os.environ.setdefault("GLOG_v", "3")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_checkpoint(work / "tiny")
        short, short_result = peak_rss_of_eval(work / "tiny", SHORT_TEXTS, work, "three_short_texts")
        long, long_result = peak_rss_of_eval(work / "tiny", [long_text(args.long_tokens)], work, "one_long_record")
    print("llama-npu eval --device cpu with its defaults, tiny model; peak host RSS of the command on the MindSpore "
          "CPU backend (not NPU memory)")
    print(f"eval, three short texts ({short_result['target_tokens']} target tokens): peak RSS {short / 2**30:.2f} GiB "
          f"({'under' if short < LIMIT_BYTES else 'OVER'} the 4 GiB bound)")
    print(f"eval, one {args.long_tokens}-token record ({long_result['target_tokens']} target tokens, "
          f"{long_result['truncated']} truncated): peak RSS {long / 2**30:.2f} GiB")
    print(f"ratio long record / short texts: {long / short:.2f}")


if __name__ == "__main__":
    main()
