"""Step time of k accumulated micro-batches against one k-times-larger batch, measured
side by side in one process (goal: ratio at most 1.05).

Both paths run the same tiny Llama 3.2 model and the same samples through our TrainStep
(steps/graph_step.py): k-1 accumulating micro-steps and a final one against the
single graph of k = 1;
steps alternate between the two so machine noise hits both alike, and the medians are
compared. The measurement repeats `--runs` times (3) and the median of the runs' ratios
is the result. CPU backend; the ratio, not the absolute time, is the result. A last line
times the model's forward pass alone the same way, k calls against one: what the backend
charges for splitting the batch before any code of ours runs.
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

    cpu_graph_mode()
    from mindspore import Tensor

    from llama_npu.model.architecture import resolve_shape

    recipe = smoke_recipe([f"data.max_seq_len={args.seq}", *(small_shape() if args.model == "small" else [])])

    rows = args.k * args.micro
    ids = random_ids(rows, args.seq)
    micro_batches = [(ids[i:i + args.micro], ids[i:i + args.micro]) for i in range(0, rows, args.micro)]
    (accumulated_step, _), (single_step, _) = our_train_step(recipe, args.k), our_train_step(recipe)
    # Beside the steps, the backend's own share: the network's forward pass (the loss cell
    # alone: no gradient, nothing of ours around it), k calls of a micro-batch against one
    # call of the whole batch. What its ratio exceeds 1 by, splitting costs before our step runs.
    forward = forward_only(single_step.final.network)  # the one-batch step's loss cell and weights
    whole, parts = Tensor(ids), [Tensor(batch[0]) for batch in micro_batches]
    ratios, forward_ratios = [], []
    for run in range(args.runs):
        medians = median_seconds({"accumulated": lambda: accumulated_step(micro_batches, lr=1e-4),
                                  "one batch": lambda: single_step([(ids, ids)], lr=1e-4),
                                  "forward k calls": lambda: [forward(part) for part in parts][-1].asnumpy(),
                                  "forward one call": lambda: forward(whole).asnumpy()}, args.steps)
        accumulated, single = medians["accumulated"], medians["one batch"]
        ratios.append(accumulated / single)
        forward_ratios.append(medians["forward k calls"] / medians["forward one call"])
        print(f"run {run + 1}: k={args.k} micro-batches of {args.micro} {accumulated * 1000:.0f} ms/step, "
              f"one batch of {rows} {single * 1000:.0f} ms/step, ratio {ratios[-1]:.3f}; forward alone "
              f"{medians['forward k calls'] * 1000:.0f} / {medians['forward one call'] * 1000:.0f} ms, "
              f"ratio {forward_ratios[-1]:.3f}")
    hidden = resolve_shape(recipe.model).hidden_size
    print(f"{args.model} Llama 3.2 (hidden {hidden}, vocab 128,256), {rows} x {args.seq} tokens per optimizer step, "
          f"backend CPU, median of {args.steps} alternating steps per run")
    print(f"ratio accumulated / one batch: {statistics.median(ratios):.3f}, the median of {args.runs} runs "
          f"({', '.join(f'{r:.3f}' for r in ratios)}; goal <= 1.05)")
    print(f"the forward pass alone, split the same way (no gradients, no accumulation code): "
          f"{statistics.median(forward_ratios):.3f}, the median of {args.runs} runs "
          f"({', '.join(f'{r:.3f}' for r in forward_ratios)})")


def forward_only(loss_cell):
    """A cell giving the summed loss of a batch whose labels are its ids, as the steps above
    are fed (mindspore is imported only after cpu_graph_mode has quieted it)."""
    from mindspore import nn

    class ForwardOnly(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.loss_cell = loss_cell

        def construct(self, ids):
            return self.loss_cell(ids, ids)

    return ForwardOnly()


if __name__ == "__main__":
    main()
