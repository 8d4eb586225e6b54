"""Set-up shared by the step-time benchmarks: MindSpore's CPU backend in GRAPH_MODE, the
smoke recipe's model, random token batches, and paths timed side by side."""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def cpu_graph_mode():
    """MindSpore on the CPU backend in GRAPH_MODE, its logs kept out of the working directory."""
    from llama_npu.common.frameworks import mute_mindformers_info, quiet_frameworks

    quiet_frameworks(Path(tempfile.gettempdir()) / "llama-npu-logs" / "benchmarks")
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    mute_mindformers_info()
    return ms


def smoke_recipe(overrides: List[str]):
    """recipes/cpu_smoke.yaml with one micro-batch per step unless `overrides` say otherwise."""
    from llama_npu.recipe.load import load_recipe

    return load_recipe(REPO / "recipes" / "cpu_smoke.yaml", ["train.global_batch_size=0", *overrides])


def small_shape(hidden: int = 256, layers: int = 4) -> List[str]:
    """Recipe overrides for a small Llama 3.2 with its proportions: head size 64, four query
    heads a KV head, MLP 4 x hidden (the tiny preset's head is 97% of its FLOPs)."""
    heads = max(hidden // 64, 1)
    return [f"model.hidden_size={hidden}", f"model.num_layers={layers}", f"model.num_heads={heads}",
            f"model.num_kv_heads={max(heads // 4, 1)}", f"model.intermediate_size={4 * hidden}"]


def build_for_training(recipe):
    """(net, loss_cell, optimizer) with seed 0, so that two builds start from the same weights."""
    import mindspore as ms

    from llama_npu.strategies.network import build_network
    from llama_npu.steps.optimizer import build_optimizer

    ms.set_seed(0)
    net, loss_cell = build_network(recipe, on_ascend=False)
    return net, loss_cell, build_optimizer(net.trainable_params(), recipe.train)


def our_train_step(recipe, accumulation_steps: int = 1):
    """(TrainStep, net): our step (steps/graph_step.py) around a fresh build, as
    training/session.py makes it on one device, for `accumulation_steps` micro-batches a step."""
    from llama_npu.strategies.precision import LossScaler
    from llama_npu.steps.graph_step import TrainStep

    net, loss_cell, optimizer = build_for_training(recipe)
    return TrainStep(loss_cell, optimizer, LossScaler(recipe.strategies.precision), recipe.train.grad_clip,
                     accumulation_steps), net


def random_ids(rows: int, seq: int) -> np.ndarray:
    """(rows, seq + 1) token ids below the special tokens: the model sees seq positions."""
    return np.random.default_rng(0).integers(0, 128000, (rows, seq + 1)).astype(np.int32)


def median_seconds(paths: Dict[str, Callable[[], object]], steps: int) -> Dict[str, float]:
    """Each path's median wall time over `steps` calls. Every path runs once first (it
    compiles its graphs); then the calls alternate between the paths, so that noise from
    other work on the machine hits them alike."""
    for run in paths.values():
        run()
    times = {name: [] for name in paths}
    for _ in range(steps):
        for name, run in paths.items():
            begin = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - begin)
    return {name: statistics.median(values) for name, values in times.items()}
