"""What verifying a checkpoint costs before it is read (#41): checksums.json's CRC-32 pass over
a model.ckpt, side by side in one process with the read it protects (mindspore.load_checkpoint,
what eval, generate and quantize do next), as a ratio, and projected to Llama 3.2 3B's
model.ckpt (3,212,749,824 parameters: 6.43 GB in bfloat16, 12.85 GB in float32).

A .ckpt of --gb gigabytes of random bfloat16 weights is written tensor by tensor (in 3B's
MLP shape, 8192 x 3072) in a temporary directory with its checksums.json, then each side
runs --runs times from a warm page cache; the best of each is kept. Host CPU only: the CRC
is computed on the host whatever the device, so this is the figure an Ascend host pays too,
at its own CPU's speed (a cold disk adds its read time to both sides alike).

    python benchmarks/verified_reads.py              # 1 GB, ~30 s
    python benchmarks/verified_reads.py --gb 0.05    # the test's size
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from llama_npu.common import checksums  # noqa: E402
from llama_npu.common.checksums import check, write_manifest  # noqa: E402
from llama_npu.weights.tensor_files import CkptWriter  # noqa: E402

PARAMS_3B = 3_212_749_824
ROWS, COLS = 8192, 3072  # a 3B MLP weight


def write_ckpt(directory: Path, gigabytes: float) -> int:
    rng = np.random.default_rng(0)
    writer = CkptWriter(directory / "model.ckpt")
    tensors = max(1, round(gigabytes * 1e9 / (ROWS * COLS * 2)))
    rows = min(ROWS, int(gigabytes * 1e9 / (COLS * 2))) or 1
    block = rng.integers(0, 2 ** 16, (rows, COLS), dtype=np.uint16)  # bfloat16 bit patterns
    for i in range(tensors):
        writer.write(f"model.layers.{i}.feed_forward.w1.weight", "BF16", block.shape, iter([block]))
    crc = writer.close()
    write_manifest(directory, "benchmarks/verified_reads.py", {"model.ckpt": crc})
    return (directory / "model.ckpt").stat().st_size


def best(seconds, runs: int, action) -> float:
    for _ in range(runs):
        begin = time.perf_counter()
        action()
        seconds.append(time.perf_counter() - begin)
    return min(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="size of the checkpoint timed")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    import mindspore as ms

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        size = write_ckpt(directory, args.gb)

        def verify():
            checksums._SOUND.clear()  # pylint: disable=protected-access  (time the pass, not the memo)
            assert check(directory, ["model.ckpt"]).problem is None

        verify_s = best([], args.runs, verify)
        load_s = best([], args.runs, lambda: ms.load_checkpoint(str(directory / "model.ckpt")))
    rate = size / verify_s
    print(f"model.ckpt of {size / 1e9:.2f} GB: CRC-32 verification {verify_s:.2f} s ({rate / 1e9:.2f} GB/s), "
          f"mindspore.load_checkpoint {load_s:.2f} s")
    print(f"projected for Llama 3.2 3B: {2 * PARAMS_3B / rate:.1f} s in bfloat16, {4 * PARAMS_3B / rate:.1f} s "
          f"in float32 (host CPU, warm page cache)")
    print(f"ratio verification / load: {verify_s / load_s:.2f}")


if __name__ == "__main__":
    main()
