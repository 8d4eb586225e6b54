"""The exact parameter count of a Llama shape, remembered between commands."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path

from ..common.frameworks import mute_mindformers_info, quiet_frameworks
from ..model.llama import count_parameters


def cached_parameter_count(shape) -> int:
    """The real model's parameter count (model.count_parameters builds it without weights,
    which needs MindSpore: ~3 s), remembered per shape and MindFormers version in the user's
    cache directory so later plans answer in well under 2 s."""
    key = hashlib.sha256(repr((shape, metadata.version("mindformers"))).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "llama-npu" / "param_counts.json"
    try:
        counts = json.loads(cache.read_text())
    except (OSError, ValueError):
        counts = {}
    if key not in counts:
        quiet_frameworks(Path(tempfile.gettempdir()) / "llama-npu-logs" / "plan")
        mute_mindformers_info()
        counts[key] = count_parameters(shape)
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(counts))
            os.replace(tmp, cache)
        except OSError:
            pass  # a read-only home only costs the next plan the rebuild
    return counts[key]
