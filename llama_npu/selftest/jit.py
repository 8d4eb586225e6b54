"""The jit level and backend MindSpore 2.9.0 compiles a graph at: there is no Python binding
that returns the effective level, so it is derived by the rule of `MsContext::GetJitLevel` and
`MsContext::GetBackend` (mindspore/core/utils/ms_context.cc, the source whose log strings
libmindspore_core.so carries; read in docs/research for issue 29, section 1):

1. a Cell's own jit config (`Cell.set_jit_config`: jit_level, backend), else
2. the global one (`set_context(jit_config={"jit_level": ...})`), else
3. on Ascend in graph mode: O2 on the 910A (`ascend910`), O0 on later SoCs; elsewhere O0;
4. then, on Ascend, a rank-table launch (RANK_TABLE_FILE or MINDSPORE_HCCL_CONFIG_PATH set,
   not msrun's dynamic cluster, which sets MS_ROLE) is forced to O2 whatever was set.

The backend is the one the config names, else GE at O2 (graph sink) and ms_backend
(kernel by kernel) below it. A leaf: the dry run derives it for a SoC it is not on.
"""
from __future__ import annotations

import os
from typing import Mapping, Optional


def jit_level_and_backend(target: str, soc: str, cell_config: Optional[Mapping] = None,
                          global_config: Optional[Mapping] = None, env: Optional[Mapping] = None) -> dict:
    """{"jit_level", "backend"} a graph-mode graph compiles at on `target` ("cpu" | "ascend")
    and `soc` ("910a", "910b", ...)."""
    env = os.environ if env is None else env
    cell_config, global_config = cell_config or {}, global_config or {}
    backend = cell_config.get("backend", "")
    level = cell_config.get("jit_level", "") if backend or cell_config.get("jit_level", "O0") != "O0" else ""
    if not level:
        level = global_config.get("jit_level") or ("O2" if target == "ascend" and soc == "910a" else "O0")
    rank_table = env.get("RANK_TABLE_FILE") or env.get("MINDSPORE_HCCL_CONFIG_PATH")
    if target == "ascend" and rank_table and not env.get("MS_ROLE"):
        level = "O2"
    return {"jit_level": level, "backend": backend or ("GE" if level == "O2" else "ms_backend")}
