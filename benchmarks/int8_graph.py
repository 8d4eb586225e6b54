"""The nodes an int8 base adds to the 3B's forward graph, and the compile time they cost, on
MindSpore's CPU backend (issue 39).

The 910A's (and the CPU's) int8 layers dequantize 2^21 weights at a time
(model/int8_linear.py): the 3B's seven linear weights a layer split into 5 + 2 + 2 + 5 + 13
+ 13 + 12 blocks, 1,456 over its 28 layers, each block a chain of its own (an ordering
Depend, the slices of q and s, the fp32 cast, the product, the cast to fp16, the matmul)
and the concat of the blocks. A graph's size is its node count, not its tensors' sizes,
so the 3B's graph is built at an eighth of its width (hidden 384, MLP 1024, 24 heads /
8 KV heads, the full vocabulary) with the block cut to 2^21 / 64 weights: every weight then
splits into as many blocks as the 3B's (counted in the IR: 52 sliced blocks a layer).
--layers N builds N of the 3B's 28 identical layers (28 by default). LoRA rank 8 on wq, wk,
wv and wo, O2 fp16, one sequence of 64 tokens.

The forward of the train loss cell, in GRAPH_MODE, over an int8 base and over the same
model with an fp16 base, side by side in this process: each compiled twice, once timed,
once with its IR dumped (save_graphs) to count its nodes.

    .venv/bin/python benchmarks/int8_graph.py [--layers 28]
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

WIDTH = 8  # the 3B's width over the graph's built here
SETS = ["model.preset=llama3.2-3b", f"model.hidden_size={3072 // WIDTH}", f"model.intermediate_size={8192 // WIDTH}",
        "model.random_init=true", "strategies.lora.enabled=true", "strategies.precision.amp_level=O2",
        "strategies.precision.dtype=float16", "data.max_seq_len=64", "train.micro_batch_size=1",
        "data.eval_files=[]"]


def build(ms, base_dtype: str, layers: int):
    import numpy as np

    from llama_npu.recipe.load import load_recipe
    from llama_npu.strategies.network import build_network

    recipe = load_recipe(REPO / "recipes" / "cpu_smoke.yaml", [*SETS, f"strategies.lora.base_dtype={base_dtype}",
                                                                        f"model.num_layers={layers}"])
    ms.set_seed(0)
    _, cell = build_network(recipe, on_ascend=False)
    cell.set_train(True)
    ids = ms.Tensor(np.random.default_rng(0).integers(0, 128000, (1, 65)).astype(np.int32))
    return cell, (ids, ids)


def compile_seconds(ms, base_dtype: str, layers: int) -> float:
    cell, inputs = build(ms, base_dtype, layers)
    start = time.perf_counter()
    cell.compile(*inputs)
    return time.perf_counter() - start


def graph_nodes(ms, base_dtype: str, layers: int) -> tuple[int, int]:
    """(CNodes, StridedSlices of an int8 weight) of the compiled forward's final frontend IR."""
    with tempfile.TemporaryDirectory() as tmp:
        cell, inputs = build(ms, base_dtype, layers)
        ms.set_context(save_graphs=1, save_graphs_path=tmp)
        try:
            cell.compile(*inputs)
        finally:
            ms.set_context(save_graphs=0)
        (ir,) = Path(tmp).glob("*_validate_*.ir")
        text = ir.read_text()
    lines = text.splitlines()
    nodes = [re.match(r"\s*%\d+\(\S*\) = (?:PrimFunc_)?(\w+)\(", line) for line in lines]
    blocks = sum(bool(node) and node.group(1) == "StridedSlice" and "-> (<Tensor[Int8]" in typed
                 for node, typed in zip(nodes, lines[1:]))
    return sum(map(bool, nodes)), blocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=28, help="decoder layers (the 3B has 28)")
    layers = parser.parse_args().layers
    from llama_npu.common.frameworks import mute_mindformers_info, quiet_frameworks

    quiet_frameworks(Path(tempfile.gettempdir()) / "llama-npu-logs" / "benchmarks")
    import mindspore as ms

    import llama_npu.model.int8_linear as int8_linear

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    mute_mindformers_info()
    int8_linear.DEQUANT_BLOCK //= WIDTH * WIDTH  # the 3B's blocks a weight at an eighth of its width
    found = {}
    for dtype, label in (("compute", "fp16 base"), ("int8", "int8 base")):
        seconds = compile_seconds(ms, dtype, layers)
        nodes, blocks = graph_nodes(ms, dtype, layers)
        found[dtype] = nodes, seconds
        print(f"{label}, {layers} layers: {nodes:,} nodes in the forward graph ({blocks:,} dequantized blocks), "
              f"compiled in {seconds:.1f} s", flush=True)
    (nodes, seconds), (float_nodes, float_seconds) = found["int8"], found["compute"]
    print(f"the int8 base adds {nodes - float_nodes:,} nodes ({(nodes - float_nodes) / layers:,.0f} a layer) and "
          f"{seconds - float_seconds:.1f} s of compile time: x{seconds / float_seconds:.2f}")


if __name__ == "__main__":
    main()
