"""The host optimizer's AdamW kernel (steps/host/kernel.py, numba) against torch's fused CPU
AdamW (aten _fused_adamw_, the kernel the host optimizer ran before; torch is the test extra's),
side by side in one process, the calls alternating, over `--params` fp32 parameters on
`--threads` threads, beside the host's memory bandwidth (goal: ours at >= 0.8 of it, issue 55).

Each kernel reads w, g, m, v and writes w, m, v: 28 bytes a parameter. The bandwidth is the
faster of a streaming add (c = a + b, 12 bytes an element) and a copy (8 bytes), each timed
both as torch runs them and as a numba parallel loop, so that neither library's threading
alone sets the reference.

    .venv/bin/python benchmarks/host_adamw_kernel.py [--params 50000000] [--threads N] [--steps 5]
"""
from __future__ import annotations

import argparse
import os

import numpy as np

from host_optimizer import best_seconds, host_adamw  # our HostAdamW.update, as the offload benchmark times it

BYTES_A_PARAMETER = 28


def streams(n: int) -> dict:
    """name -> (call, bytes an element): torch's and numba's add and copy over fp32 arrays."""
    import torch
    from numba import njit, prange

    @njit(parallel=True)
    def add(a, b, c):
        for i in prange(c.size):
            c[i] = a[i] + b[i]

    @njit(parallel=True)
    def copy(a, c):
        for i in prange(c.size):
            c[i] = a[i]

    a, b, c = (torch.rand(n, dtype=torch.float32) for _ in range(3))
    x, y, z = a.numpy(), b.numpy(), c.numpy()
    return {"add (torch)": (lambda: torch.add(a, b, out=c), 12), "copy (torch)": (lambda: c.copy_(a), 8),
            "add (numba)": (lambda: add(x, y, z), 12), "copy (numba)": (lambda: copy(x, z), 8)}


def torch_fused(n: int):
    """torch's fused CPU AdamW over the same sizes (its step counter held, as we held it)."""
    import torch

    w, m, v = torch.rand(n), torch.zeros(n), torch.zeros(n)
    g, step = w * 1e-3, torch.tensor(1.0)
    return lambda: torch._fused_adamw_([w], [g], [m], [v], [], [step], lr=1e-4, beta1=0.9, beta2=0.999,
                                       weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=50_000_000)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    n = args.params // 1024 * 1024

    import numba
    import torch

    torch.set_num_threads(args.threads)
    numba.set_num_threads(args.threads)
    copies = streams(n)
    kernels = {"numba fused AdamW (ours, steps/host/kernel.py)": host_adamw(n, args.threads),
               "torch fused AdamW (_fused_adamw_)": torch_fused(n)}
    seconds = best_seconds({**{name: run for name, (run, _) in copies.items()}, **kernels}, args.steps)
    bandwidth = {name: per * n / seconds[name] for name, (_, per) in copies.items()}
    reference = max(bandwidth.values())
    print(f"host memory bandwidth, {args.threads} thread(s), {n:,} fp32 elements: " +
          ", ".join(f"{name} {value / 1e9:.1f} GB/s" for name, value in bandwidth.items()) +
          f" (reference: {reference / 1e9:.1f})")
    rates = {name: n / seconds[name] for name in kernels}
    for name, rate in rates.items():
        print(f"{name:<50} {rate:>14,.0f} parameters/s  {rate * BYTES_A_PARAMETER / 1e9:6.1f} GB/s  "
              f"{rate * BYTES_A_PARAMETER / reference:.2f} of the bandwidth")
    ours_rate, torch_rate = rates.values()
    print(f"ratio ours / torch fused: {ours_rate / torch_rate:.2f}; ours at "
          f"{ours_rate * BYTES_A_PARAMETER / reference:.2f} of the host's memory bandwidth (goal >= 0.8)")


if __name__ == "__main__":
    main()
