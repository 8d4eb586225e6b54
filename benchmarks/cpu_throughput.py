"""Training FLOP/s of the tiny and a small Llama 3.2 on this machine, as a fraction of the
FLOP/s MindSpore's own matmul reaches here, measured in one run.

A training step costs 6 x parameters x tokens FLOPs (2 forward, 4 backward; with tied
embeddings the LM head is the embedding matrix, counted once), 8 x with full recompute,
which runs the forward twice; attention scores are left out (short sequences). The step is
our TrainStep at one micro-batch, as training/loop.py runs it. The reference is one float32
N x N @ N x N MatMul in GRAPH_MODE, 2 N^3 FLOPs, timed in turn with the training steps.
The small model keeps Llama 3.2's proportions: head size 64, four query heads a KV head,
MLP 4 x hidden.

    .venv/bin/python benchmarks/cpu_throughput.py [--micro 2] [--seq 128] [--steps 10] [--matmul 1024]
        [--small-hidden 256] [--small-layers 4] [--recompute]
"""
from __future__ import annotations

import argparse

import numpy as np

from _common import cpu_graph_mode, median_seconds, our_train_step, random_ids, small_shape, smoke_recipe


def matmul_step(ms, n: int):
    """One float32 n x n @ n x n MatMul in GRAPH_MODE, reduced to a scalar so that reading
    the result back costs nothing."""
    class MatMul(ms.nn.Cell):
        def construct(self, a, b):
            return ms.ops.matmul(a, b).sum()

    rng = np.random.default_rng(0)
    a, b = (ms.Tensor(rng.standard_normal((n, n), dtype=np.float32)) for _ in range(2))
    cell = MatMul()
    return lambda: cell(a, b).asnumpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro", type=int, default=2, help="samples per step")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--matmul", type=int, default=1024, help="N of the reference matmul")
    parser.add_argument("--small-hidden", type=int, default=256)
    parser.add_argument("--small-layers", type=int, default=4)
    parser.add_argument("--recompute", action="store_true", help="full recompute in both models")
    args = parser.parse_args()

    ms = cpu_graph_mode()
    common = [f"data.max_seq_len={args.seq}", f"train.micro_batch_size={args.micro}",
              f"strategies.recompute.mode={'full' if args.recompute else 'none'}"]
    ids = random_ids(args.micro, args.seq)
    models = {name: our_train_step(smoke_recipe(common + shape))
              for name, shape in (("tiny", []), ("small", small_shape(args.small_hidden, args.small_layers)))}
    # The reference alternates with the training steps, so that other work on the machine
    # slows all three alike.
    paths = {"matmul": matmul_step(ms, args.matmul),
             **{name: lambda step=step: step([(ids, ids)], lr=1e-4) for name, (step, _) in models.items()}}
    medians = median_seconds(paths, args.steps)
    reference = 2 * args.matmul ** 3 / medians["matmul"]

    tokens = args.micro * args.seq
    passes = 8 if args.recompute else 6
    print(f"reference: float32 {args.matmul} x {args.matmul} MatMul, GRAPH_MODE, backend CPU: "
          f"{reference / 1e9:.1f} GFLOP/s")
    print(f"training: {tokens} tokens per step ({args.micro} x {args.seq}), AdamW, recompute "
          f"{'full' if args.recompute else 'none'}, {passes} x params x tokens FLOPs, median of {args.steps} steps")
    print(f"{'model':<7}{'parameters':>13}{'ms/step':>10}{'GFLOP/s':>10}{'fraction':>10}")
    fractions = []
    for name, (_, net) in models.items():
        params = sum(p.size for p in net.trainable_params())
        rate = passes * params * tokens / medians[name]
        fractions.append(f"{name} {rate / reference:.2f}")
        print(f"{name:<7}{params:>13,}{medians[name] * 1000:>10.0f}{rate / 1e9:>10.1f}{rate / reference:>10.2f}")
    print(f"fraction of matmul FLOP/s: {', '.join(fractions)}")


if __name__ == "__main__":
    main()
