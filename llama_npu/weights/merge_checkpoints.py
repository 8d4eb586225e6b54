"""Merge the per-rank weight shards of a semi-auto parallel run into one checkpoint, with
MindSpore's checkpoint transformation (mindspore.transform_checkpoints) and the sharding
strategy files the run saved.

Layout it reads: <run>/checkpoints/rank_<R>/step_<N>/model.ckpt and
<run>/strategy/rank_<R>.ckpt, one of each per rank. Without a pipeline every rank's
strategy file describes the whole network; with one, each stage's file holds only its
own parameters, and mindspore.merge_pipeline_strategys joins them first (as MindFormers'
checkpoint transformation does, mindformers/tools/ckpt_transform/transform_checkpoint.py).
Each rank's weights are cut to the parameters its own strategy file names before the
transformation: transform_checkpoints loads the ranks in descending order, keyed by
rank % stage_device_num, so another stage's stale copy in a low rank's file (runs that saved
every parameter on every rank) would otherwise overwrite the owning stage's value.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

from ..checkpoints.files import WEIGHTS, rank_roots, read_state, verify_read
from ..common.atomic import check_writable, staged_directory
from ..common.checksums import write_manifest
from ..model.architecture import resolve_shape
from ..recipe.stored import STORED_RECIPE, stored_recipe


class MergeError(RuntimeError):
    pass


def pipeline_stages(run_dir: Path) -> int:
    recipe = stored_recipe(run_dir)
    if recipe is None:
        raise MergeError(f"{Path(run_dir) / STORED_RECIPE}: not found; the run writes it at start and merging "
                         f"needs its strategies.parallel.pipeline")
    return recipe.strategies.parallel.pipeline


def stage_parameters(strategy_file: Path) -> set:
    """The parameters a rank's own strategy file lays out: those of its pipeline stage."""
    import mindspore as ms  # imported here: --help imports this module; MindSpore, only to merge

    strategy = ms.train.node_strategy_pb2.ParallelStrategyMap()
    strategy.ParseFromString(Path(strategy_file).read_bytes())
    return {item.param_name for item in strategy.parallel_layout_item}


def source_strategy(run_dir: Path, work_dir: Path) -> Path:
    """The strategy file that describes every parameter of the run: rank 0's, or with
    pipeline stages the per-rank files merged into <work_dir>/merged_strategy.ckpt."""
    import mindspore as ms  # imported here: --help imports this module; MindSpore, only to merge

    strategy_dir = Path(run_dir) / "strategy"
    files = sorted(strategy_dir.glob("rank_*.ckpt"))
    if not files:
        raise MergeError(f"{strategy_dir}: no rank_<R>.ckpt strategy files; each rank of a sharded run writes "
                         f"its own when its train graph compiles")
    if pipeline_stages(run_dir) == 1:
        return strategy_dir / "rank_0.ckpt"
    merged = Path(work_dir) / "merged_strategy.ckpt"
    ms.merge_pipeline_strategys(str(strategy_dir), str(merged))
    return merged


def model_description(run_dir: Path, weights: Path) -> dict:
    """config.json for merged whole weights, as train writes it beside a step's model.ckpt:
    the run's shape, the weights' dtype and the Hugging Face config of the base it started
    from, so that eval, generate and convert ms-to-hf take the directory."""
    from .pretrained import checkpoint_tensors, read_checkpoint_dir  # imported here: numpy, needless for --help

    recipe = stored_recipe(run_dir)
    if recipe.strategies.lora.enabled:
        raise MergeError(f"{run_dir}: a LoRA run's shards hold adapters, not a model; merge them into a .ckpt "
                         f"--dst and export with convert ms-to-hf --src BASE --weights FILE --merge-lora")
    codes = {t.code for t in checkpoint_tensors(weights).values()}
    base = read_checkpoint_dir(Path(recipe.model.checkpoint))[1] if recipe.model.checkpoint else {}
    return {"format": "llama-npu", "shape": resolve_shape(recipe.model).__dict__,
            "dtype": {"F16": "float16", "BF16": "bfloat16"}.get(min(codes), "float32"), "source": str(run_dir),
            "hf_config": base.get("hf_config")}


def merge_shards(run_dir: Path, dst: Path, step: Optional[int] = None) -> Path:
    """The shards of `step` (default: the newest complete on every rank) merged into `dst`:
    a .ckpt file, or a directory (model.ckpt and config.json) that eval, generate and
    convert ms-to-hf take as they take a converted one."""
    import mindspore as ms  # imported here: --help imports this module; MindSpore, only to merge

    run_dir, dst = Path(run_dir), Path(dst)
    as_directory = dst.suffix != ".ckpt"
    if as_directory and dst.exists():
        raise MergeError(f"{dst} exists; remove it or choose another --dst")
    check_writable(dst, "--dst")
    ranks = rank_roots(run_dir)
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
        pipelined = pipeline_stages(run_dir) > 1
        # transform_checkpoints wants <dir>/rank_<R>/<one .ckpt>: each rank's own parameters.
        for index, rank in enumerate(ranks):
            shard = rank / f"step_{step}" / WEIGHTS
            if read_state(shard.parent) is None:
                raise MergeError(f"{shard.parent} is not a complete checkpoint")
            verify_read([shard])
            src = Path(tmp) / "src" / f"rank_{index}" / WEIGHTS
            src.parent.mkdir(parents=True)
            if not pipelined:  # every rank holds every parameter's shard: link it
                os.symlink(shard.resolve(), src)
                continue
            own = stage_parameters(run_dir / "strategy" / f"rank_{index}.ckpt")
            ms.save_checkpoint(ms.load_checkpoint(str(shard), choice_func=lambda name: name in own), str(src))
        ms.transform_checkpoints(str(Path(tmp) / "src"), str(Path(tmp) / "dst"), "merged",
                                 src_strategy_file=str(strategy), dst_strategy_file=None)
        merged = next((Path(tmp) / "dst").rglob("*.ckpt"))
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not as_directory:
            shutil.move(str(merged), str(dst))
            return dst
        description = model_description(run_dir, merged)
        with staged_directory(dst) as staging:
            shutil.move(str(merged), str(staging / WEIGHTS))
            (staging / "config.json").write_text(json.dumps(description, indent=2), encoding="utf-8")
            write_manifest(staging, f"llama-npu merge-checkpoints {run_dir} --step {step} --dst {dst}")
    return dst
