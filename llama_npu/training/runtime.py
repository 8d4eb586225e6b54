"""MindSpore process set-up for a run: backend, graph or eager mode, seeds."""
from __future__ import annotations

from ..common.frameworks import mute_mindformers_info
from ..recipe.schema import Recipe


def init_runtime(recipe: Recipe) -> bool:
    """Configure MindSpore for the recipe; returns True when running on Ascend."""
    import mindspore as ms  # imported here: MindSpore loads after the command's quiet_frameworks (common/frameworks.py)

    on_ascend = recipe.device.target == "ascend"
    ms.set_context(mode=ms.GRAPH_MODE if recipe.train.mode == "graph" else ms.PYNATIVE_MODE)
    ms.set_device("Ascend" if on_ascend else "CPU")
    if on_ascend and recipe.device.max_device_memory:
        ms.runtime.set_memory(max_size=recipe.device.max_device_memory)
    ms.set_seed(recipe.train.seed)
    mute_mindformers_info()
    return on_ascend
