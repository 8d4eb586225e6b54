"""Peak host memory of the full and the chunked cross-entropy path, side by side.

Each path runs in its own child process (peak RSS is per process): the tiny Llama 3.2
model with the full 128,256-token vocabulary, one forward+backward of a batch of
BATCH x SEQ tokens, whose full fp32 logits alone are BATCH*SEQ*128256*4 bytes.

What this measures is host memory on MindSpore's CPU backend. It is not NPU memory, and
the CPU backend does not reuse buffers the way Ascend does (FACTS.md), so read the ratio
as "the chunked path never materialises the whole logits", not as an NPU saving.

    .venv/bin/python benchmarks/chunked_ce_memory.py [--batch 4] [--seq 512] [--chunk 512]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def measure(chunk: int, batch: int, seq: int, mode: str) -> dict:
    """Child process: one loss+gradient pass, then report peak RSS."""
    import numpy as np

    import mindspore as ms

    from llama_npu.common.frameworks import mute_mindformers_info
    from llama_npu.memory.measure import peak_memory
    from llama_npu.recipe.load import load_recipe
    from llama_npu.strategies.network import build_network

    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    mute_mindformers_info()
    overrides = [f"data.max_seq_len={seq}", "train.global_batch_size=0", f"train.mode={mode}"]
    if chunk:
        overrides += ["strategies.chunked_ce.enabled=true", f"strategies.chunked_ce.chunk_size={chunk}"]
    ms.set_seed(0)
    net, loss_cell = build_network(load_recipe(REPO / "recipes" / "cpu_smoke.yaml", overrides), on_ascend=False)
    ids = np.random.default_rng(0).integers(0, 128000, (batch, seq + 1)).astype(np.int32)
    grad_fn = ms.value_and_grad(loss_cell, None, net.trainable_params())
    baseline, _ = peak_memory(on_ascend=False)
    loss, grads = grad_fn(ms.Tensor(ids), ms.Tensor(ids))
    loss = float(loss.asnumpy())  # kernels run asynchronously: wait for them before reading the peak
    peak, source = peak_memory(on_ascend=False)
    return {"chunk": chunk, "loss": loss, "peak_bytes": peak, "before_step_bytes": baseline, "source": source}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("graph", "pynative"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child, args.batch, args.seq, args.mode)))
        return

    tokens = args.batch * args.seq
    print(f"tiny Llama 3.2 (vocab 128,256), one forward+backward of {args.batch} x {args.seq} = {tokens} "
          f"tokens; full fp32 logits {tokens * 128256 * 4 / 2**30:.2f} GiB")
    print("backend CPU, measure: peak host RSS of a fresh process (includes ~0.7 GiB of framework)")
    print(f"{'mode':<10}{'full GiB':>10}{'chunked GiB':>13}{'ratio':>8}   loss full / chunked")
    env = {"GLOG_v": "3", "LOG_MF_PATH": "/tmp/llama-npu-bench-logs", **os.environ}
    for mode in ("graph", "pynative"):
        results = {}
        for chunk in (0, args.chunk):
            out = subprocess.run([sys.executable, __file__, "--child", str(chunk), "--mode", mode,
                                  "--batch", str(args.batch), "--seq", str(args.seq)],
                                 capture_output=True, text=True, check=True, cwd=REPO, env=env)
            results[chunk] = json.loads(out.stdout.strip().splitlines()[-1])
        full, chunked = results[0], results[args.chunk]
        print(f"{mode:<10}{full['peak_bytes'] / 2**30:>10.2f}{chunked['peak_bytes'] / 2**30:>13.2f}"
              f"{chunked['peak_bytes'] / full['peak_bytes']:>8.2f}   {full['loss']:.2f} / {chunked['loss']:.2f}")
    print(f"chunk size {args.chunk} tokens")


if __name__ == "__main__":
    main()
