"""Step time of k accumulated micro-batches against one k-times-larger batch, measured
side by side in one process (goal: ratio at most 1.05).

Both paths run the same tiny Llama 3.2 model and the same samples through our TrainStep
(strategies/accumulation.py): k-1 accumulating micro-steps and a final one against the
single graph of k = 1;
steps alternate between the two so machine noise hits both alike, and the medians are
compared. The measurement repeats `--runs` times (3) and the median of the runs' ratios
is the result. CPU backend; the ratio, not the absolute time, is the result. A last line
splits out what each extra micro-step costs whatever its size (--micro 2 or more).
`--model small` measures the same on the small model of cpu_throughput.py (hidden 256, 4
layers), whose tied head is a smaller share of the step.

    .venv/bin/python benchmarks/grad_accum_overhead.py [--k 4] [--micro 2] [--seq 128] [--steps 10] [--runs 3]
        [--model tiny|small]
"""
from __future__ import annotations

import argparse
import statistics

from _common import cpu_graph_mode, median_seconds, our_train_step, random_ids, small_shape, smoke_recipe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--micro", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", choices=("tiny", "small"), default="tiny")
    args = parser.parse_args()

    ms = cpu_graph_mode()
    from mindspore import Tensor

    from llama_npu.architecture import resolve_shape

    recipe = smoke_recipe([f"data.max_seq_len={args.seq}", *(small_shape() if args.model == "small" else [])])

    rows = args.k * args.micro
    ids = random_ids(rows, args.seq)
    micro_batches = [(ids[i:i + args.micro], ids[i:i + args.micro]) for i in range(0, rows, args.micro)]
    (accumulated_step, _), (single_step, _) = our_train_step(recipe, args.k), our_train_step(recipe)
    ratios = []
    for run in range(args.runs):
        medians = median_seconds({"accumulated": lambda: accumulated_step(micro_batches, lr=1e-4),
                                  "one batch": lambda: single_step([(ids, ids)], lr=1e-4)}, args.steps)
        accumulated, single = medians["accumulated"], medians["one batch"]
        ratios.append(accumulated / single)
        print(f"run {run + 1}: k={args.k} micro-batches of {args.micro} {accumulated * 1000:.0f} ms/step, "
              f"one batch of {rows} {single * 1000:.0f} ms/step, ratio {ratios[-1]:.3f}")
    hidden = resolve_shape(recipe.model).hidden_size
    print(f"{args.model} Llama 3.2 (hidden {hidden}, vocab 128,256), {rows} x {args.seq} tokens per optimizer step, "
          f"backend CPU, median of {args.steps} alternating steps per run")
    print(f"ratio accumulated / one batch: {statistics.median(ratios):.3f}, the median of {args.runs} runs "
          f"({', '.join(f'{r:.3f}' for r in ratios)}; goal <= 1.05)")
    if args.micro < 2:
        return
    # What a micro-step costs whatever its size (the head's passes over the 128,256 x H
    # weight, the add into the accumulators, the graph's launch), from micro-steps of 1 and
    # of `micro` rows: the cost of one row extrapolated to none.
    tokens = Tensor(float(rows * args.seq), ms.float32)
    one, full = (Tensor(ids[:n]) for n in (1, args.micro))
    timed = median_seconds({"1 row": lambda: accumulated_step.accumulating(tokens, one, one),
                            "micro": lambda: accumulated_step.accumulating(tokens, full, full)}, args.steps)
    fixed = timed["1 row"] - (timed["micro"] - timed["1 row"]) / (args.micro - 1)
    print(f"fixed cost of a micro-step: {fixed * 1000:.0f} ms (micro-steps of 1 and {args.micro} rows: "
          f"{timed['1 row'] * 1000:.0f}, {timed['micro'] * 1000:.0f} ms); the {args.k - 1} extra micro-steps "
          f"cost {(args.k - 1) * fixed / single:.3f} of one batch's step")


if __name__ == "__main__":
    main()
