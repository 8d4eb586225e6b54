"""What `report` says of one run beside its curves: the recipe's choices that matter, the
summary, the plan's figures beside the measured ones, the checkpoints (each read against its
checksums) and the run's history. Read only: nothing in the run directory changes."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, List, Optional, Tuple

from .pictures import segment_starts
from .series import Series

GIB = 2 ** 30


def _get(tree: dict, dotted: str, default=None):
    for key in dotted.split("."):
        if not isinstance(tree, dict) or key not in tree:
            return default
        tree = tree[key]
    return tree


def recipe_choices(recipe: dict) -> List[Tuple[str, str]]:
    """(what, value) of the stored recipe's keys that decide a run's memory, speed and result."""
    st = lambda key: _get(recipe, f"strategies.{key}")  # noqa: E731 -- a short reader for the rows below
    lora = f"rank {st('lora.rank')}, base {st('lora.base_dtype') or 'compute'}" if st("lora.enabled") else "off"
    recompute = st("recompute.mode") or "none"
    return [("model", f"{_get(recipe, 'model.preset')}"
             + (f" from {_get(recipe, 'model.checkpoint')}" if _get(recipe, "model.checkpoint") else " (random init)")),
            ("objective", str(_get(recipe, "train.objective", "sft"))),
            ("device", f"{_get(recipe, 'device.name')} ({_get(recipe, 'device.target')})"),
            ("precision", f"{st('precision.amp_level')} "  # O0 computes in float32 whatever dtype says
                          f"{'float32' if st('precision.amp_level') == 'O0' else st('precision.dtype')}, loss scale "
                          f"{st('precision.loss_scale')}"),
            ("strategies", f"recompute {recompute}, chunked CE {'on' if st('chunked_ce.enabled') else 'off'}, "
                           f"LoRA {lora}, optimizer on the {'host' if st('offload.optimizer') == 'host' else 'card'}"),
            ("layout", f"data {st('parallel.data')} x model {st('parallel.model') or 1} x pipeline "
                       f"{st('parallel.pipeline') or 1}"),
            ("sequence length", str(_get(recipe, "data.max_seq_len"))),
            ("batch", f"micro-batch {_get(recipe, 'train.micro_batch_size')}, global "
                      f"{_get(recipe, 'train.global_batch_size') or 'micro-batch x data'}"),
            ("schedule", f"{_get(recipe, 'train.max_steps')} steps, lr {_get(recipe, 'train.optimizer.lr')}, "
                         f"warm-up {_get(recipe, 'train.warmup_steps')}")]


def summary_of(run_dir: Path) -> dict:
    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def checkpoints(run_dir: Path) -> List[Tuple[str, Optional[str]]]:
    """(step directory relative to the run, None when it verifies else why not), newest first;
    a sharded run's every rank_<R> copy. Each file is read against its CRC-32."""
    from ..checkpoints.files import checkpoint_root, inspect, rank_roots, step_dirs_newest_first

    found = []
    for root in rank_roots(run_dir) or [checkpoint_root(run_dir)]:
        for path in step_dirs_newest_first(root):
            found.append((str(path.relative_to(run_dir)), inspect(path, verify=True)[1]))
    return found


def measured_and_planned(series: Series, summary: dict, plan_arguments: Callable) -> List[Tuple[str, str, str]]:
    """(what, plan's figure, the run's) for peak memory and, where plan predicts one, step time."""
    peaks = series.curves.get("peak_memory_bytes", ([], []))[1]
    planned = series.curves.get("planned_peak_bytes", ([], []))[1]
    source = {"host_rss": "host peak RSS (CPU: no proxy for NPU memory)", "device": "device counter"}.get(
        series.memory_source, "measured")
    rows = [("peak memory", f"{planned[-1] / GIB:.2f} GiB" if planned else "n/a",
             f"{max(peaks) / GIB:.2f} GiB, {source}" if peaks else "n/a")]
    steps = series.curves.get("step_seconds", ([], []))
    timed = sorted(v for s, v in zip(*steps) if s not in segment_starts(series))
    predicted = planned_step_seconds(series.run_dir, plan_arguments)
    if timed or predicted is not None:
        rows.append(("step time", f"{predicted:.3f} s" if predicted is not None else "n/a (plan predicts none)",
                     f"{timed[len(timed) // 2]:.3f} s, median after each compiling first step" if timed else "n/a"))
    return rows


def planned_step_seconds(run_dir: Path, plan_arguments: Callable) -> Optional[float]:
    """plan's predicted step time for the run's recipe (plan --json's step_time), or None where
    plan predicts none or cannot plan the stored recipe. `plan_arguments(recipe)`: what `plan
    RECIPE --json` parses, handed in by the command (report/ sits below the command line)."""
    from ..memory.plan_report import run_plan

    try:
        output, _ = run_plan(plan_arguments(run_dir / "recipe.yaml"))
        total = (json.loads(output).get("step_time") or {}).get("total_seconds")
    except Exception:  # noqa: BLE001 -- a recipe plan cannot take (moved data, an older key) has no prediction
        return None
    return float(total) if isinstance(total, (int, float)) else None
