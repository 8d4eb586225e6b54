"""Step time of k accumulated micro-batches against one k-times-larger batch, measured
side by side in one process (goal: ratio at most 1.05).

Both paths run the same tiny Llama 3.2 model and the same samples through our TrainStep;
steps alternate between the two so machine noise hits both alike, and the medians are
compared. CPU backend; the ratio, not the absolute time, is the result.

    .venv/bin/python benchmarks/grad_accum_overhead.py [--k 4] [--micro 2] [--seq 128] [--steps 10]
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--micro", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    import mindspore as ms

    from llama_npu.build import build_network
    from llama_npu.optim import build_optimizer
    from llama_npu.recipe import load_recipe
    from llama_npu.runtime import mute_mindformers_info
    from llama_npu.strategies.accumulation import TrainStep
    from llama_npu.strategies.precision import LossScaler

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    mute_mindformers_info()
    recipe = load_recipe(REPO / "recipes" / "cpu_smoke.yaml",
                         [f"data.max_seq_len={args.seq}", "train.global_batch_size=0"])

    def make_step():
        ms.set_seed(0)
        net, loss_cell = build_network(recipe, on_ascend=False)
        optimizer = build_optimizer(net.trainable_params(), recipe.train)
        return TrainStep(loss_cell, optimizer, LossScaler(recipe.strategies.precision), recipe.train.grad_clip)

    rng = np.random.default_rng(0)
    rows = args.k * args.micro
    ids = rng.integers(0, 128000, (rows, args.seq + 1)).astype(np.int32)
    micro_batches = [(ids[i:i + args.micro], ids[i:i + args.micro]) for i in range(0, rows, args.micro)]
    paths = {"accumulated": (make_step(), micro_batches), "one batch": (make_step(), [(ids, ids)])}
    times = {name: [] for name in paths}
    for name, (step, batches) in paths.items():  # compile both first
        step(batches, lr=1e-4)
    for _ in range(args.steps):
        for name, (step, batches) in paths.items():
            begin = time.perf_counter()
            step(batches, lr=1e-4)
            times[name].append(time.perf_counter() - begin)
    accumulated, single = statistics.median(times["accumulated"]), statistics.median(times["one batch"])
    print(f"tiny Llama 3.2 (vocab 128,256), {rows} x {args.seq} tokens per optimizer step, backend CPU, "
          f"median of {args.steps} alternating steps")
    print(f"k={args.k} micro-batches of {args.micro}: {accumulated * 1000:.0f} ms/step")
    print(f"one batch of {rows}:           {single * 1000:.0f} ms/step")
    print(f"ratio accumulated / one batch: {accumulated / single:.3f} (goal <= 1.05)")


if __name__ == "__main__":
    main()
