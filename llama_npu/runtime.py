"""MindSpore process set-up: backend, graph or eager mode, seeds, log noise."""
from __future__ import annotations

import logging
import os
from pathlib import Path

from .recipe import Recipe


def quiet_frameworks(log_dir: Path) -> None:
    """Send MindFormers' file logs into the run directory instead of ./output, and keep
    MindSpore's C++ log to errors. Must run before mindspore/mindformers are imported."""
    os.environ.setdefault("GLOG_v", "3")
    os.environ.setdefault("LOG_MF_PATH", str(Path(log_dir) / "mindformers"))
    os.environ.setdefault("LOCAL_DEFAULT_PATH", str(Path(log_dir) / "mindformers"))


def init_runtime(recipe: Recipe) -> bool:
    """Configure MindSpore for the recipe; returns True when running on Ascend."""
    import mindspore as ms

    on_ascend = recipe.device.target == "ascend"
    ms.set_context(mode=ms.GRAPH_MODE if recipe.train.mode == "graph" else ms.PYNATIVE_MODE)
    ms.set_device("Ascend" if on_ascend else "CPU")
    if on_ascend and recipe.device.max_device_memory:
        ms.runtime.set_memory(max_size=recipe.device.max_device_memory)
    ms.set_seed(recipe.train.seed)
    mute_mindformers_info()
    return on_ascend


def mute_mindformers_info() -> None:
    """MindFormers logs every model build at INFO, and import-time warnings about optional
    packages, on stdout, where they would break `--json` output and bury our own lines. Its
    stdout handler is bound while the package is imported, so import it with stdout
    captured (its log files under LOG_MF_PATH keep everything); then raise the level of
    its loggers, whose names embed the log path."""
    import contextlib
    import io
    import sys

    if "mindformers" not in sys.modules:
        with contextlib.redirect_stdout(io.StringIO()):
            import mindformers  # noqa: F401  (creates its loggers)

    for name in list(logging.root.manager.loggerDict):
        if name.startswith("mindformers"):
            logging.getLogger(name).setLevel(logging.WARNING)
