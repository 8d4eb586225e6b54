"""`llama-npu merge-checkpoints`: the per-rank shards of a sharded run as one checkpoint
(weights/merge_checkpoints.py)."""
from __future__ import annotations

from pathlib import Path

from ..weights.merge_checkpoints import merge_shards


def add_parser(subparsers) -> None:
    merge = subparsers.add_parser("merge-checkpoints", help="merge the per-rank shards of a sharded run")
    merge.add_argument("run_dir", help="the run's output directory")
    merge.add_argument("--step", type=int, help="step to merge (default: newest complete on every rank)")
    merge.add_argument("--dst", required=True, help="a .ckpt file to write, or a directory to create (model.ckpt "
                                                    "and config.json: what eval, generate and convert ms-to-hf take)")
    merge.set_defaults(func=run)


def run(args) -> int:
    path = merge_shards(Path(args.run_dir), Path(args.dst), args.step)
    print(f"merged weights written to {path}")
    return 0
