"""The jit level and backend the selftest reports for a device, by the rule the train step
itself uses (common/jit_level.py, which repeats MindSpore 2.9.0's MsContext::GetJitLevel),
with a Cell's own jit config first: `Cell.set_jit_config` (jit_level, backend) outranks the
global one. A leaf apart from that rule: the dry run derives it for a SoC it is not on.
"""
from __future__ import annotations

import os
from typing import Mapping, Optional

from ..common.jit_level import backend_of, effective_jit_level, explicit_level, soc_version


def jit_level_and_backend(target: str, soc: str, cell_config: Optional[Mapping] = None,
                          global_config: Optional[Mapping] = None, env: Optional[Mapping] = None) -> dict:
    """{"jit_level", "backend"} a graph-mode graph compiles at on `target` ("cpu" | "ascend")
    and `soc` ("910a", "910b", ...)."""
    cell_config, global_config = cell_config or {}, global_config or {}
    level = effective_jit_level(explicit_level(cell_config, global_config), "Ascend" if target == "ascend" else "CPU",
                                True, soc_version(soc), os.environ if env is None else env)
    return {"jit_level": level, "backend": cell_config.get("backend") or backend_of(level)}
