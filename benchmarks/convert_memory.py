"""Peak host RSS of `llama-npu convert hf-to-ms` and `convert ms-to-hf` on the Llama 3.2 1B
shape in float32, and what it projects for 3B.

A random-weight Hugging Face directory of the shape (config.json, model.safetensors: about
5 GB for 1B in float32, written tensor by tensor) is made in a temporary directory, then
converted both ways by the real command line, each in a child process that reports its
own peak RSS (VmHWM, benchmarks/child_peak.py); the directory is deleted afterwards. The conversions hold
about one tensor at a time (weights/tensor_files.py), so the peak is the process's base plus
the largest tensor (the embedding, 128,256 x hidden) plus a few 64 MB row blocks: the 3B
projection is the 1B peak less the 1B embedding plus the 3B one. The round trip is checked
bit-exact on the embedding and the last layer's MLP.

    python benchmarks/convert_memory.py                  # 1B, float32 (~15 GB of disk, ~2 min)
    python benchmarks/convert_memory.py --hidden 256 --layers 2   # the test's shrunk shape
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from child_peak import run_with_peak  # noqa: E402
from llama_npu.model.architecture import PRESETS  # noqa: E402
from llama_npu.weights.convert import hf_config  # noqa: E402
from llama_npu.weights.tensor_files import HF_WEIGHTS, SafetensorsWriter, expected_shapes, row_blocks, safetensors_index

BOUND = 4 * 2**30


def write_random_hf(directory: Path, shape) -> int:
    """A Hugging Face directory of `shape` with random float32 weights; returns its bytes."""
    import json

    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(hf_config(shape, "float32")), encoding="utf-8")
    shapes = expected_shapes(shape)
    writer = SafetensorsWriter(directory / HF_WEIGHTS, [(name, "F32", dims) for name, dims in shapes.items()])
    rng = np.random.default_rng(0)
    for name, dims in shapes.items():
        blocks = row_blocks(np.empty(dims, np.float32))  # the shape only: no memory is touched
        writer.write(name, (rng.standard_normal((len(range(*s.indices(dims[0]))),) + dims[1:], np.float32) * 0.02
                            for s in blocks))
    writer.close()
    return (directory / HF_WEIGHTS).stat().st_size


def peak_rss(*args) -> tuple[int, float]:
    """(peak RSS in bytes, seconds) of `llama-npu ARGS` in a child process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    begin = time.perf_counter()
    with tempfile.TemporaryFile() as stderr:
        code, peak = run_with_peak(args, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        seconds = time.perf_counter() - begin
        if code != 0:
            stderr.seek(0)
            raise SystemExit(f"llama-npu {' '.join(map(str, args))} failed: {stderr.read().decode()[-2000:]}")
    return peak, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, help="shrink the 1B shape to this hidden size (heads 4 / 2)")
    parser.add_argument("--layers", type=int, help="and to this many layers")
    args = parser.parse_args()
    shape = PRESETS["llama3.2-1b"]
    if args.hidden:
        shape = replace(shape, hidden_size=args.hidden, num_heads=4, num_kv_heads=2, intermediate_size=2 * args.hidden)
    if args.layers:
        shape = replace(shape, num_layers=args.layers)
    largest = shape.vocab_size * shape.hidden_size * 4
    largest_3b = shape.vocab_size * PRESETS["llama3.2-3b"].hidden_size * 4
    with tempfile.TemporaryDirectory(prefix="convert-memory-") as tmp:
        tmp = Path(tmp)
        size = write_random_hf(tmp / "hf", shape)
        print(f"shape: {shape.describe()}; {size / 2**30:.2f} GiB of float32 safetensors; largest tensor "
              f"{largest / 2**30:.2f} GiB")
        results = {}
        results["hf-to-ms"] = peak_rss("convert", "hf-to-ms", "--src", tmp / "hf", "--dst", tmp / "ms")
        results["ms-to-hf"] = peak_rss("convert", "ms-to-hf", "--src", tmp / "ms", "--dst", tmp / "back")
        original, back = safetensors_index(tmp / "hf" / HF_WEIGHTS), safetensors_index(tmp / "back" / HF_WEIGHTS)
        for name in ("model.embed_tokens.weight", f"model.layers.{shape.num_layers - 1}.mlp.down_proj.weight"):
            assert np.array_equal(original[name].read(), back[name].read()), f"{name} changed in the round trip"
    for direction, (peak, seconds) in results.items():
        print(f"{direction}: peak RSS {peak / 2**30:.2f} GiB in {seconds:.1f} s; 3B projection "
              f"{(peak - largest + largest_3b) / 2**30:.2f} GiB")
    worst = max(peak for peak, _ in results.values())
    verdict = "under" if worst - largest + largest_3b < BOUND else "OVER"
    print(f"round trip bit-exact; peak RSS {worst / 2**30:.2f} GiB, 3B projected "
          f"{(worst - largest + largest_3b) / 2**30:.2f} GiB ({verdict} the 4 GiB bound)")
    if verdict == "OVER":
        raise SystemExit(1)


if __name__ == "__main__":
    main()
