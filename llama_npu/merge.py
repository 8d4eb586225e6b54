"""Merge the per-rank weight shards of a semi-auto parallel run into one checkpoint, with
MindSpore's checkpoint transformation (mindspore.transform_checkpoints) and the sharding
strategy file the run saved (<run>/strategy.ckpt).

Layout it reads: <run>/checkpoints/rank_<R>/step_<N>/model.ckpt, one directory per rank.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Optional

from .checkpoint import WEIGHTS, checkpoint_root, read_state


class MergeError(RuntimeError):
    pass


def rank_dirs(run_dir: Path) -> list[Path]:
    root = checkpoint_root(run_dir)
    found = sorted((int(m.group(1)), p) for p in root.glob("rank_*") if (m := re.fullmatch(r"rank_(\d+)", p.name)))
    return [p for _, p in found]


def merge_shards(run_dir: Path, dst: Path, step: Optional[int] = None) -> Path:
    import mindspore as ms

    run_dir, dst = Path(run_dir), Path(dst)
    ranks = rank_dirs(run_dir)
    if not ranks:
        raise MergeError(f"{run_dir}: no checkpoints/rank_<R> directories; only runs with model, pipeline "
                         f"or optimizer sharding save per-rank shards (a data-parallel run saves whole weights)")
    if step is None:
        steps = [{int(p.name[5:]) for p in r.glob("step_*") if read_state(p) is not None} for r in ranks]
        common = set.intersection(*steps)
        if not common:
            raise MergeError(f"{run_dir}: no step is complete on every rank")
        step = max(common)
    strategy = run_dir / "strategy.ckpt"
    if not strategy.is_file():
        raise MergeError(f"{strategy}: the sharding strategy file is missing; it is written by the run")
    with tempfile.TemporaryDirectory() as tmp:
        # transform_checkpoints wants <dir>/rank_<R>/<one .ckpt>: link the weights there.
        for index, rank in enumerate(ranks):
            shard = rank / f"step_{step}" / WEIGHTS
            if read_state(shard.parent) is None:
                raise MergeError(f"{shard.parent} is not a complete checkpoint")
            (Path(tmp) / "src" / f"rank_{index}").mkdir(parents=True)
            os.symlink(shard.resolve(), Path(tmp) / "src" / f"rank_{index}" / WEIGHTS)
        ms.transform_checkpoints(str(Path(tmp) / "src"), str(Path(tmp) / "dst"), "merged",
                                 src_strategy_file=str(strategy), dst_strategy_file=None)
        merged = next((Path(tmp) / "dst").rglob("*.ckpt"))
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(merged), str(dst))
    return dst
