"""Checkpoints: atomic save, keep-last-K, find the newest complete one, load.

Layout of `<run>/checkpoints/step_<N>/`:
  model.ckpt       trained weights, loadable with mindspore.load_checkpoint
  optimizer.ckpt   optimizer state (moments, step counter, learning rate)
  state.json       the sidecar: step, samples consumed, RNG, loss scale, recipe hash and the
                   byte size of each file above; written last, so its presence (with sizes that
                   match) is what makes a checkpoint complete.
A checkpoint is written under a temporary name and renamed into place, so a crash while
saving leaves the previous checkpoints untouched. Both .ckpt files carry MindSpore's CRC
(crc_check), so resuming also notices a file damaged without changing its size.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Optional

from .atomic import staged_directory
from .console import warn

WEIGHTS = "model.ckpt"
OPTIMIZER = "optimizer.ckpt"
SIDECAR = "state.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(RuntimeError):
    pass


def checkpoint_root(run_dir: Path, world=None) -> Path:
    """Where step_<N> directories live: <run>/checkpoints, or <run>/checkpoints/rank_<R>
    when parameters are sharded across ranks (semi-auto parallel), one shard per rank."""
    root = Path(run_dir) / "checkpoints"
    return root / f"rank_{world.rank}" if world is not None and world.sharded else root


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _named(params) -> list:
    return [{"name": p.name, "data": p} for p in params]


def optimizer_state_params(optimizer, model_params) -> list:
    """The optimizer's own Parameters (moments, step, lr), not the model weights it holds."""
    model_ids = {id(p) for p in model_params}
    return [p for p in optimizer.get_parameters() if id(p) not in model_ids]


def save_checkpoint(root: Path, step: int, model_params, optimizer_params, state: dict,
                    keep_last: int, model_description: Optional[dict] = None) -> Path:
    """Write <root>/step_<step> atomically and keep the newest `keep_last`. With a
    `model_description` (full fine-tunes) the step directory also gets the config.json of a
    converted checkpoint, so eval, generate, quantize and ms-to-hf take it directly."""
    import mindspore as ms

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    # replace=True: re-saving a step after a resume swaps it, never leaving a gap.
    with staged_directory(final, replace=True) as partial:
        ms.save_checkpoint(_named(model_params), str(partial / WEIGHTS), crc_check=True)
        ms.save_checkpoint(_named(optimizer_params), str(partial / OPTIMIZER), crc_check=True)
        if model_description is not None:
            (partial / "config.json").write_text(json.dumps(model_description, indent=2), encoding="utf-8")
        state = dict(state, step=step,
                     files={name: (partial / name).stat().st_size for name in (WEIGHTS, OPTIMIZER)})
        with open(partial / SIDECAR, "w", encoding="utf-8") as fh:
            json.dump(state, fh, indent=2)
            fh.flush()
            os.fsync(fh.fileno())
        for name in (WEIGHTS, OPTIMIZER):
            with open(partial / name, "rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(root)
    _prune(root, keep_last)
    return final


def _inspect(path: Path) -> tuple[Optional[dict], Optional[str]]:
    """(sidecar, None) for a complete checkpoint, else (None, why it is not)."""
    try:
        state = json.loads((path / SIDECAR).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        return None, f"sidecar {SIDECAR} unreadable ({exc})"
    for name, size in state.get("files", {}).items():
        actual = (path / name).stat().st_size if (path / name).exists() else -1
        if actual != size:
            return None, f"{name} has {actual} bytes, expected {size}"
    return state, None


def problem(path: Path) -> Optional[str]:
    """Why `path` is not a complete checkpoint, or None when it is."""
    return _inspect(path)[1]


def read_state(path: Path) -> Optional[dict]:
    """The sidecar of a complete checkpoint, or None (with the reason as a warning)."""
    state, reason = _inspect(path)
    if reason is not None:
        warn(f"skipping checkpoint {path}: {reason}")
    return state


def _step_dirs(root: Path):
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


def step_dirs_newest_first(root: Path) -> list:
    return list(reversed(_step_dirs(Path(root))))


def _prune(root: Path, keep_last: int) -> None:
    complete = [p for p in _step_dirs(root) if (p / SIDECAR).exists()]
    for path in complete[:-keep_last]:
        shutil.rmtree(path)


def load_checkpoint(path: Path, net, optimizer) -> dict:
    """Load weights into `net` and state into `optimizer`; return the sidecar."""
    import mindspore as ms

    state = read_state(path)
    if state is None:
        raise CheckpointError(f"{path} is not a complete checkpoint")
    # Both files are read (and CRC-checked) before either is loaded, so a damaged one
    # leaves the network and optimizer untouched.
    contents = {}
    for name in (WEIGHTS, OPTIMIZER):
        try:
            contents[name] = ms.load_checkpoint(str(path / name), crc_check=True)
        except (ValueError, RuntimeError, OSError) as exc:
            raise CheckpointError(f"{path / name} is damaged or unreadable ({exc})") from exc
    not_loaded, _ = ms.load_param_into_net(net, contents[WEIGHTS], strict_load=True)
    missing = [n for n in not_loaded if n in {p.name for p in net.trainable_params()}]
    if missing:
        raise CheckpointError(f"{path / WEIGHTS} lacks trained weights: {', '.join(missing[:5])}")
    ms.load_param_into_net(optimizer, contents[OPTIMIZER], strict_load=True)
    return state
