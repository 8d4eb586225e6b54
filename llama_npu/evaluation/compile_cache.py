"""MindSpore's compile cache for the exam scorer's graphs, in a directory of ours.

MindSpore 2.9 caches compiled graphs when MS_COMPILER_CACHE_ENABLE=1, under
MS_COMPILER_CACHE_PATH (these replace the deprecated context `enable_compile_cache`; the
default path is the current directory, where we never write). Read in
mindspore/graph/api.py and checked on the CPU backend:
- the path is read once, at the process's first compile; the switch at every compile;
- graphs are stored by their order of compile in the process (compile_cache_N.mindir), and
  reloaded by that order, checked only against a hash of the entry script;
- parameter values are not taken from the cache: a model of the same shape with other
  weights scores with its own.
So a directory here holds one sequence of graphs, named by a digest of everything that
decides them: the model's shape and parameter dtype, the batch size, the graphs in the
order they are compiled (the caller compiles them up front, sorted), and the versions of
MindSpore, MindFormers and of our own sources. A second `eval --task` of the same shapes
loads its graphs instead of compiling them.

The root is $LLAMA_NPU_COMPILE_CACHE, or ~/.cache/llama-npu/compile ($XDG_CACHE_HOME
respected); LLAMA_NPU_COMPILE_CACHE=off compiles without it. A graph file holds the weights
(a 3B's entry is 6-13 GB), and an upgrade of llama-npu, MindSpore or MindFormers makes every
entry unreachable: enabling the cache removes the entries another version made, once they
have gone unused for an hour (a run of the other version may still be reading one).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Optional

ROOT_ENV = "LLAMA_NPU_COMPILE_CACHE"
MADE_BY = "made_by.json"  # in each entry: the versions that made it
STALE_AFTER = 3600  # seconds an entry of another version stays unused before it is removed


def cache_root() -> Optional[Path]:
    """Where the graphs go; None when switched off."""
    chosen = os.environ.get(ROOT_ENV, "")
    if chosen.lower() == "off":
        return None
    if chosen:
        return Path(chosen)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llama-npu" / "compile"


def _sources_digest() -> str:
    """Our package's sources: a change to the network code must not load an old graph."""
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parent.parent
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def directory(key: dict) -> Optional[Path]:
    """The directory of the graphs `key` describes; None when the cache is switched off or
    MindSpore could not hash the entry script (it reads sys.argv[0] as a file)."""
    root = cache_root()
    entry = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if root is None or entry is None or not entry.is_file():
        return None
    import mindformers
    import mindspore

    described = {**key, **_versions()}
    return root / hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:20]


def _versions() -> dict:
    import mindformers
    import mindspore

    return {"mindspore": mindspore.__version__, "mindformers": mindformers.__version__, "sources": _sources_digest()}


def _remove_stale(root: Path, versions: dict) -> None:
    """Entries of `root` made by other versions (or before entries named theirs), unused for
    STALE_AFTER seconds: no run of these versions can load them."""
    for entry in root.iterdir():
        try:
            made = json.loads((entry / MADE_BY).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            made = None
        try:
            unused = time.time() - max(p.stat().st_mtime for p in [entry, *entry.rglob("*")])
        except OSError:  # removed meanwhile by another run
            continue
        if entry.is_dir() and made != versions and unused > STALE_AFTER:
            shutil.rmtree(entry, ignore_errors=True)


def holds(key: dict) -> Optional[bool]:
    """Whether the cache holds the graphs `key` describes; None when it is not used."""
    path = directory(key)
    return None if path is None else any(path.rglob("*.mindir"))


def enable(key: dict) -> Optional[Path]:
    """Turn the cache on for the graphs `key` describes and return its directory; None (the
    graphs compile as usual) when it is not used (directory) or this process already chose
    its directory (MindSpore reads the path once)."""
    path = directory(key)
    if path is None or os.environ.get("MS_COMPILER_CACHE_PATH"):
        return None
    path.mkdir(parents=True, exist_ok=True)
    versions = _versions()
    (path / MADE_BY).write_text(json.dumps(versions), encoding="utf-8")
    _remove_stale(path.parent, versions)
    os.environ["MS_COMPILER_CACHE_PATH"] = str(path)
    os.environ["MS_COMPILER_CACHE_ENABLE"] = "1"
    return path


def disable() -> None:
    """Graphs compiled from now on are neither stored nor loaded (the path stays as chosen)."""
    if os.environ.get("MS_COMPILER_CACHE_ENABLE") == "1":
        os.environ["MS_COMPILER_CACHE_ENABLE"] = "0"
