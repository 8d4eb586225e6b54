"""Step time of our training step against a bare TrainOneStepCell on the same model and
data, measured side by side in one process (goal: ratio at most 1.03).

Ours is the TrainStep that training/loop.py runs (steps/graph_step.py) at one micro-batch
per step, with the recipe's clipping on (train.grad_clip 1.0): one graph of a
TrainOneStepWithLossScaleCell subclass -- forward, backward, the overflow check, the
global norm, clipping, `if not overflow: optimizer(grads)` -- and one read of the step's
loss, norm, overflow flag and scale. The bare path is
`mindspore.nn.TrainOneStepCell(loss_cell, optimizer)`: one graph, forward, backward and the
optimizer, no clipping, no overflow check. Both use our optimizer (AdamW from the recipe)
and the tiny Llama 3.2 of recipes/cpu_smoke.yaml built from the same seed, and see the
same batch; steps alternate between the two and the medians are compared.

Why not MindFormers' own MFTrainOneStepCell: on the CPU backend it does not run. Its
overflow check treats every target other than GPU as an Ascend 910A and calls
NPUGetFloatStatusV2, which has no CPU kernel (MindSpore 2.9.0, MindFormers 1.9.0); our
subclass takes an is-finite reduction there instead. Its plain base,
mindspore.nn.TrainOneStepCell, is the bare loop it extends.

The per-step Python of training/loop.py's loop around the step (metrics line, peak-memory read,
batch assembly) is outside both timings. CPU backend; the ratio is the result.

    .venv/bin/python benchmarks/harness_overhead.py [--micro 4] [--seq 128] [--steps 10]
"""
from __future__ import annotations

import argparse

from _common import build_for_training, cpu_graph_mode, median_seconds, our_train_step, random_ids, smoke_recipe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro", type=int, default=4, help="samples per step")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    ms = cpu_graph_mode()
    recipe = smoke_recipe([f"data.max_seq_len={args.seq}", f"train.micro_batch_size={args.micro}"])
    ids = random_ids(args.micro, args.seq)
    ours, _ = our_train_step(recipe)
    _, loss_cell, optimizer = build_for_training(recipe)
    bare = ms.nn.TrainOneStepCell(loss_cell, optimizer)
    bare.set_train(True)
    # Both paths turn the numpy batch into tensors on every step, as the loop does.
    medians = median_seconds({"ours": lambda: ours([(ids, ids)], lr=1e-4),
                              "bare": lambda: bare(ms.Tensor(ids), ms.Tensor(ids)).asnumpy()}, args.steps)
    print(f"tiny Llama 3.2 (vocab 128,256), one batch of {args.micro} x {args.seq} tokens per step, AdamW, "
          f"our clipping at {recipe.train.grad_clip}, "
          f"backend CPU, median of {args.steps} alternating steps")
    print(f"our TrainStep:                  {medians['ours'] * 1000:.0f} ms/step")
    print(f"bare nn.TrainOneStepCell:       {medians['bare'] * 1000:.0f} ms/step")
    print(f"ratio ours / bare: {medians['ours'] / medians['bare']:.3f} (goal <= 1.03)")


if __name__ == "__main__":
    main()
