"""Merge the per-rank weight shards of a semi-auto parallel run into one checkpoint, with
MindSpore's checkpoint transformation (mindspore.transform_checkpoints) and the sharding
strategy files the run saved.

Layout it reads: <run>/checkpoints/rank_<R>/step_<N>/model.ckpt and
<run>/strategy/rank_<R>.ckpt, one of each per rank. Without a pipeline every rank's
strategy file describes the whole network; with one, each stage's file holds only its
own parameters, and mindspore.merge_pipeline_strategys joins them first (as MindFormers'
checkpoint transformation does, mindformers/tools/ckpt_transform/transform_checkpoint.py).
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Optional

from .checkpoint import WEIGHTS, checkpoint_root, read_state
from .stored_recipe import STORED_RECIPE, stored_recipe


class MergeError(RuntimeError):
    pass


def rank_dirs(run_dir: Path) -> list[Path]:
    root = checkpoint_root(run_dir)
    found = sorted((int(m.group(1)), p) for p in root.glob("rank_*") if (m := re.fullmatch(r"rank_(\d+)", p.name)))
    return [p for _, p in found]


def source_strategy(run_dir: Path, work_dir: Path) -> Path:
    """The strategy file that describes every parameter of the run: rank 0's, or with
    pipeline stages the per-rank files merged into <work_dir>/merged_strategy.ckpt."""
    import mindspore as ms

    strategy_dir = Path(run_dir) / "strategy"
    files = sorted(strategy_dir.glob("rank_*.ckpt"))
    if not files:
        raise MergeError(f"{strategy_dir}: no rank_<R>.ckpt strategy files; each rank of a sharded run writes "
                         f"its own when its train graph compiles")
    recipe = stored_recipe(run_dir)
    if recipe is None:
        raise MergeError(f"{Path(run_dir) / STORED_RECIPE}: not found; the run writes it at start and merging "
                         f"needs its strategies.parallel.pipeline")
    stages = recipe.strategies.parallel.pipeline
    if stages == 1:
        return strategy_dir / "rank_0.ckpt"
    merged = Path(work_dir) / "merged_strategy.ckpt"
    ms.merge_pipeline_strategys(str(strategy_dir), str(merged))
    return merged


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
    with tempfile.TemporaryDirectory() as tmp:
        strategy = source_strategy(run_dir, Path(tmp))
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
