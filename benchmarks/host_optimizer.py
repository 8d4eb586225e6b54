"""The optimizer on the host (strategies.offload): its AdamW update against the host's memory
bandwidth, beside the other CPU AdamW kernels, and the whole train step with and without it,
all measured side by side in one process, the calls alternating (goal: the update at >= 0.8 of
the bandwidth).

1. Bandwidth: a streaming add (c = a + b, 12 bytes an element) and a copy (8 bytes) over
   fp32 tensors of `--params` elements, on `--threads` threads; the faster is the reference.
2. Kernels over `--params` fp32 parameters: our HostAdamW.update (steps/host/optimizer.py:
   numba's fused loop, steps/host/kernel.py; benchmarks/host_adamw_kernel.py sets it beside
   torch's fused kernel), torch.optim.AdamW(foreach=True), MindSpore's CPU
   FusedCastAdamWeightDecay (mindspore/ops/operations/inner_ops.py: fp32 weights and moments,
   fp16 gradient) and nn.Adam(use_offload=True) (AdamNoUpdateParam on the CPU). Each one's
   parameters/s, and its bytes/s at the bytes a parameter it must read and write (28: w, g, m,
   v read, w, m, v written; 26 with an fp16 gradient), as a fraction of the bandwidth.
3. The whole train step (k accumulated micro-batches and the update) of a `--hidden` x
   `--layers` model (the smoke recipe with model.* overrides) with the optimizer on the host
   against in the graph: their median times and the ratio. The CPU backend is both "card" and
   host here, so no transfer is measured: selftest's host_optimizer measures it on a card.
4. The offload step part by part (HostStep's calls, in its order, each timed): the
   micro-batches' graphs, the gradients' copy off the "card" (asnumpy), their accumulation,
   the step-end passes (the norm, the StepEnd graph, unscale, AdamW, zeroing) and the push
   back; beside each, plan's prediction (memory/step_time.py for the same recipe on the cpu
   device, at the streaming add's bandwidth measured in 1.), and plan's predicted step beside
   the measured one. The CPU has no sourced peak, so plan's compute is unknown here: the
   predicted step takes the graphs' measured time, and predicts the rest.

    .venv/bin/python benchmarks/host_optimizer.py [--params 50000000] [--threads N] [--steps 5]
        [--hidden 256] [--layers 4] [--seq 128] [--micro 2] [--k 2] [--step-steps 3] [--amp O0|O2]
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from _common import build_for_training, cpu_graph_mode, median_seconds, our_train_step, random_ids, small_shape, \
    smoke_recipe


def best_seconds(paths: dict, steps: int) -> dict:
    """Each path's fastest of `steps` calls after one warm-up, the calls alternating between
    the paths, so that other work on the machine hits the bandwidth and the kernels alike:
    the kernels' speed, not the machine's noise."""
    for run in paths.values():
        run()
    best = {name: float("inf") for name in paths}
    for _ in range(steps):
        for name, run in paths.items():
            begin = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - begin)
    return best


def streams(n: int) -> dict:
    """The streaming add and copy over fp32 tensors of n elements, with their bytes an element."""
    import torch

    a, b, c = (torch.rand(n, dtype=torch.float32) for _ in range(3))
    return {"add": (lambda: torch.add(a, b, out=c), 12), "copy": (lambda: c.copy_(a), 8)}


def host_adamw(n: int, threads: int):
    """Our host update over one fp32 parameter of n elements, its gradient in the accumulator."""
    import mindspore as ms
    from mindspore import Parameter, Tensor

    from llama_npu.recipe.schema import OptimizerSection
    from llama_npu.steps.host.optimizer import HostAdamW

    card = [Parameter(Tensor(np.random.default_rng(0).random((n // 1024, 1024), np.float32)), name="w")]
    host = HostAdamW(card, OptimizerSection(name="adamw", lr=1e-4, weight_decay=0.1), threads, ms.float32)
    host.sums[0][...] = host.weights[0] * 1e-3
    return lambda: host.update(1e-4)


def torch_foreach(n: int):
    import torch

    weight = torch.nn.Parameter(torch.rand(n // 1024, 1024))
    weight.grad = torch.rand_like(weight) * 1e-3
    optimizer = torch.optim.AdamW([weight], lr=1e-4, weight_decay=0.1, foreach=True)
    return optimizer.step


def mindspore_fused_cast(n: int):
    import mindspore as ms
    from mindspore import Parameter, Tensor, nn, ops

    class Update(nn.Cell):
        def __init__(self):
            super().__init__()
            self.op = ops.FusedCastAdamWeightDecay()
            self.var = Parameter(Tensor(np.random.default_rng(0).random(n, np.float32)), name="var")
            self.m = Parameter(Tensor(np.zeros(n, np.float32)), name="m")
            self.v = Parameter(Tensor(np.zeros(n, np.float32)), name="v")

        def construct(self, grad):
            return self.op(self.var, self.m, self.v, 1e-4, 0.9, 0.999, 1e-8, 0.1, grad, 1.0)

    update, grad = Update(), Tensor(np.full(n, 1e-3, np.float16), ms.float16)
    return lambda: update(grad)[0].asnumpy()


def mindspore_adam_offload(n: int):
    from mindspore import Parameter, Tensor, nn

    weight = Parameter(Tensor(np.random.default_rng(0).random(n, np.float32)), name="w")
    optimizer = nn.Adam([weight], learning_rate=1e-4, weight_decay=0.1, use_offload=True)
    grads = (Tensor(np.full(n, 1e-3, np.float32)),)
    return lambda: optimizer(grads)


def host_step(recipe, k: int):
    """(HostStep, net) around a fresh seed-0 build, as training/session.py makes it with
    strategies.offload.optimizer host."""
    import mindspore as ms

    from llama_npu.strategies.network import build_network
    from llama_npu.strategies.precision import LossScaler
    from llama_npu.steps.host.step import HostStep
    from llama_npu.steps.host.build import host_optimizer

    ms.set_seed(0)
    net, loss_cell = build_network(recipe, on_ascend=False)
    host = host_optimizer(recipe, net.trainable_params())
    return HostStep(loss_cell, host, LossScaler(recipe.strategies.precision), recipe.train.grad_clip, k), net


def timed_host_step(step, micro_batches, lr: float) -> tuple:
    """One HostStep call (steps/host/step.py __call__, the same calls in its order): (each
    part's seconds, whether the step overflowed). "card": the micro-batches' graphs; "copy":
    their gradients to host numpy; "accumulate": HostAdamW.accumulate; "step_end": the norm,
    StepEnd and HostAdamW.step but its push; "push": the cast masters into the card's Parameters."""
    import mindspore as ms
    from mindspore import Tensor

    times = dict.fromkeys(("card", "copy", "accumulate", "step_end", "push"), 0.0)
    host, clock = step.host, time.perf_counter
    push = type(host).push

    def timed_push():
        begin = clock()
        push(host)
        times["push"] += clock() - begin

    host.push = timed_push
    tokens = Tensor(sum(step.count(b) for b in micro_batches), ms.float32)
    index = step.micro.embedding_index
    for batch in micro_batches:
        begin = clock()
        loss, grads, rows = step.micro(tokens, *map(Tensor, batch))
        loss.asnumpy()  # the graph's end: its outputs are all written (asnumpy waits for them)
        copied = clock()
        for grad in grads:
            grad.asnumpy()
        added = clock()
        host.accumulate(grads, index, batch[0][:, :-1], rows if index >= 0 else None)
        times["card"], times["copy"] = times["card"] + copied - begin, times["copy"] + added - copied
        times["accumulate"] += clock() - added
    begin = clock()
    out = step.end(tokens, Tensor(0.0, ms.float32), Tensor(host.square_sum(), ms.float32))
    _, _, overflow, scale, _, square_sum = (float(v) for v in out.asnumpy())
    host.step(lr, scale, step.grad_clip, overflow > 0, square_sum)
    times["step_end"] = clock() - begin - times["push"]
    del host.push
    return times, overflow > 0


def predicted_parts(recipe, bandwidth_gbs: float) -> dict:
    """plan's step time (memory/step_time.py) for `recipe` on the cpu device at `bandwidth_gbs`."""
    from llama_npu.memory.devices import get_device
    from llama_npu.memory.planner import estimate, parameter_total, strategy_from_recipe
    from llama_npu.memory.step_time import Rates, step_time
    from llama_npu.model.architecture import resolve_shape

    shape = resolve_shape(recipe.model)
    plan = estimate(shape, parameter_total(shape), get_device("cpu"), strategy_from_recipe(recipe, "cpu"))
    return step_time(plan, Rates(host_bandwidth=bandwidth_gbs))


def print_parts(measured: dict, predicted: dict) -> None:
    """Each part's prediction beside its measurement, and the steps'."""
    seconds = predicted["parts"]
    plan = {"card": None, "copy": 0.0, "accumulate": seconds["host_accumulate"],
            "step_end": seconds["host_step_end"], "push": seconds["host_push"]}
    why = {"card": "plan: unknown peak on the CPU", "copy": "plan: none, asnumpy shares a CPU tensor's memory"}
    print(f"offload step part by part (CPU backend; plan's host passes at {predicted['host_bandwidth_gbs']:.1f} GB/s):")
    for name, value in measured.items():
        guess = plan[name]
        ratio = f"ratio measured / predicted {value / guess:.2f}" if guess else why[name]
        shown = f"{guess * 1e3:9.2f} ms" if guess is not None else "  unknown   "
        print(f"  {name:<11} measured {value * 1e3:9.2f} ms  predicted {shown}  {ratio}")
    step = sum(measured.values())
    guess = measured["card"] + sum(v for v in plan.values() if v)
    print(f"ratio measured / predicted, the whole offload step: {step / guess:.2f} ({step * 1e3:.1f} ms against "
          f"{guess * 1e3:.1f} ms: the graphs' measured {measured['card'] * 1e3:.1f} ms + plan's host parts)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=50_000_000)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--micro", type=int, default=2)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--step-steps", type=int, default=3)
    parser.add_argument("--amp", choices=("O0", "O2"), default="O0",
                        help="the step's precision: O0 fp32, or O2 float16 with dynamic loss scaling (the recipe's)")
    args = parser.parse_args()
    n = args.params // 1024 * 1024

    cpu_graph_mode()
    import torch

    torch.set_num_threads(args.threads)
    copies = streams(n)
    kernels = {"HostAdamW (numba fused, ours)": (host_adamw(n, args.threads), 28),
               "torch AdamW foreach": (torch_foreach(n), 28),
               "MindSpore FusedCastAdamWeightDecay": (mindspore_fused_cast(n), 26),
               "MindSpore nn.Adam(use_offload=True)": (mindspore_adam_offload(n), 28)}
    seconds = best_seconds({name: run for name, (run, _) in {**copies, **kernels}.items()}, args.steps)
    bandwidths = {name: per * n / seconds[name] for name, (_, per) in copies.items()}
    reference = max(bandwidths.values())
    print(f"host memory bandwidth, {args.threads} thread(s), {n:,} fp32 elements: add {bandwidths['add'] / 1e9:.1f} "
          f"GB/s, copy {bandwidths['copy'] / 1e9:.1f} GB/s (reference: {reference / 1e9:.1f})")
    rates = {}
    for name, (_, per_param) in kernels.items():
        rates[name] = n / seconds[name]
        print(f"{name:<38} {rates[name]:>12,.0f} parameters/s  {rates[name] * per_param / 1e9:6.1f} GB/s  "
              f"{rates[name] * per_param / reference:.2f} of the bandwidth")
    ours = rates["HostAdamW (numba fused, ours)"]
    print(f"ratio ours / the best other kernel: {ours / max(v for k, v in rates.items() if 'ours' not in k):.1f}x; "
          f"ours at {ours * 28 / reference:.2f} of the host's memory bandwidth (goal >= 0.8)")

    overrides = [f"data.max_seq_len={args.seq}", "train.grad_clip=1.0", *small_shape(args.hidden, args.layers),
                 f"strategies.precision.amp_level={args.amp}",
                 f"strategies.precision.loss_scale={'dynamic' if args.amp == 'O2' else 'none'}"]
    if args.k > 1:
        overrides.append(f"train.global_batch_size={args.k * args.micro}")
    overrides.append(f"train.micro_batch_size={args.micro}")
    in_graph_recipe = smoke_recipe(overrides)
    offload_recipe = smoke_recipe([*overrides, "strategies.offload.optimizer=host",
                                   f"strategies.offload.threads={args.threads}"])
    ids = random_ids(args.k * args.micro, args.seq)
    micro_batches = [(ids[i:i + args.micro], ids[i:i + args.micro]) for i in range(0, len(ids), args.micro)]
    (in_graph, _), (offloaded, _) = our_train_step(in_graph_recipe, args.k), host_step(offload_recipe, args.k)
    params = sum(int(np.prod(p.shape)) for p in build_for_training(in_graph_recipe)[0].trainable_params())
    medians = median_seconds({"in the graph": lambda: in_graph(micro_batches, lr=1e-4),
                              "on the host": lambda: offloaded(micro_batches, lr=1e-4)}, args.step_steps)
    update = params / ours
    print(f"train step, hidden {args.hidden} x {args.layers} layers ({params:,} parameters), {args.k} x {args.micro} x "
          f"{args.seq} tokens: in the graph {medians['in the graph'] * 1e3:.1f} ms, optimizer on the host "
          f"{medians['on the host'] * 1e3:.1f} ms; the host update's share at the rate above: "
          f"{update / medians['on the host']:.1%}")
    print(f"ratio step with offload / without: {medians['on the host'] / medians['in the graph']:.2f}")
    # Steps that overflowed skip the update and the push: timed until step_steps have not (at most 4 x).
    parts = []
    for _ in range(4 * args.step_steps):
        times, overflowed = timed_host_step(offloaded, micro_batches, 1e-4)
        parts += [] if overflowed else [times]
        if len(parts) == args.step_steps:
            break
    if not parts:
        raise SystemExit(f"every one of {4 * args.step_steps} offload steps overflowed: nothing to time part by part")
    measured = {name: float(np.median([p[name] for p in parts])) for name in parts[0]}
    print_parts(measured, predicted_parts(offload_recipe, bandwidths["add"] / 1e9))


if __name__ == "__main__":
    main()
