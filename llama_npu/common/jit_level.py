"""The jit level and backend MindSpore 2.9.0 compiles the train step with, which decide the
step's kernels: in-place ones (InplaceMul, InplaceCopy) where the graph runs kernel by kernel
(O0/O1, the "ms_backend"), out-of-place ones where it sinks whole into GE (O2), whose adapter
library has none for InplaceMul or InplaceCopy.

MindSpore has no Python call that returns the effective level: it is computed in C++,
MsContext::GetJitLevel (mindspore/core/utils/ms_context.cc), which this module repeats.
"""
from __future__ import annotations

import os
from typing import Mapping

GE, MS_BACKEND = "GE", "ms_backend"


def effective_jit_level(explicit: str, device_target: str, graph_mode: bool, soc: str,
                        env: Mapping[str, str] = os.environ) -> str:
    """The level MsContext::GetJitLevel picks for a graph (a Cell compiled in GRAPH_MODE) or,
    with graph_mode False, a PyNative Cell: the one set (set_context(jit_config=...)); else O2
    on Ascend for the 910A ("ascend910") in graph mode, O0 otherwise. PyNative without jit
    turns O2 into O0. Then a rank-table launch on Ascend (RANK_TABLE_FILE or
    MINDSPORE_HCCL_CONFIG_PATH set, and not msrun's dynamic cluster, which sets MS_ROLE /
    MS_SCHED_HOST: common::UseDynamicCluster) is forced to O2 on
    every SoC, whatever was set."""
    if explicit:
        level = explicit
    elif device_target == "Ascend" and graph_mode:
        level = "O2" if soc == "ascend910" else "O0"
    else:
        level = "O0"
    if not graph_mode and level == "O2":
        level = "O0"
    rank_table = env.get("RANK_TABLE_FILE") or env.get("MINDSPORE_HCCL_CONFIG_PATH")
    dynamic_cluster = env.get("MS_ROLE") or env.get("MS_SCHED_HOST")
    if device_target == "Ascend" and rank_table and not dynamic_cluster:
        level = "O2"
    return level


def backend_of(level: str) -> str:
    """MsContext::GetBackend with no per-function backend: GE graph sink at O2, else kernel by kernel."""
    return GE if level == "O2" else MS_BACKEND


def soc_version(device_name: str) -> str:
    """The SoC string MSContext.get_ascend_soc_version returns for a device catalogue name."""
    return "ascend910" if device_name == "910a" else f"ascend{device_name}"


def default_backend(device_name: str) -> str:
    """The backend the train step compiles for on a catalogue device ("cpu", "910a", ...) as
    llama-npu launches it: graph mode, no jit level set, msrun's dynamic cluster."""
    if device_name == "cpu":
        return MS_BACKEND
    return backend_of(effective_jit_level("", "Ascend", True, soc_version(device_name), env={}))


def explicit_level(cell_config: Mapping, global_config: Mapping) -> str:
    """The level set for a Cell's graph, if any: the Cell's own (`Cell.set_jit_config`) outranks
    the global one (mindspore/nn/cell.py hands the graph executor the Cell's jit_config_dict
    when it has one). A Cell's JitConfig() with nothing set reads as O0 without a backend:
    not an explicit level."""
    backend = cell_config.get("backend", "")
    own = cell_config.get("jit_level", "") if backend or cell_config.get("jit_level", "O0") != "O0" else ""
    return own or global_config.get("jit_level", "")


def current_backend(cell=None) -> str:
    """The backend `cell`'s graph compiles for (the context's as it is set now: device, mode,
    SoC, global jit config), the Cell's own jit config first: its backend, else its level's."""
    # imported here: the selftest's dry run imports this module without loading MindSpore
    import mindspore as ms
    from mindspore._c_expression import MSContext

    own = dict(cell.jit_config_dict) if cell is not None else {}
    level = effective_jit_level(explicit_level(own, ms.get_context("jit_config") or {}),
                                ms.get_context("device_target"), ms.get_context("mode") == ms.GRAPH_MODE,
                                MSContext.get_instance().get_ascend_soc_version())
    return own.get("backend") or backend_of(level)


def in_place_kernels(cell=None) -> bool:
    """Whether `cell`'s step may use InplaceMul / InplaceCopy: not when it compiles for GE (O2)."""
    return current_backend(cell) != GE
