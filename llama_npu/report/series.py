"""`run_series(run_dir)`: what a run's pictures and its report draw, read from its files:
metrics.jsonl (one record a step; after a resume, the steps of every segment in order, since
a resume drops only the steps it trains again), history.jsonl (each start, resume, stop and
end) and recipe.yaml. Nothing is written."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import yaml

METRICS = "metrics.jsonl"
HISTORY = "history.jsonl"
# metrics.jsonl's keys that are not curves of their own, or are drawn together with another.
NOT_CURVES = {"step", "overflow", "nonfinite_in_a_row", "samples_consumed", "memory_source", "target_tokens",
              "host_rss_bytes", "eval_tokens"}
# The curves every objective logs (training/loop.py step_record); any other number in a record
# is the objective's own metric (its name as the objective logs it, e.g. TRL's rewards/chosen).
COMMON = ("loss", "eval_loss", "lr", "grad_norm", "tokens_per_s", "step_seconds", "loss_scale",
          "peak_memory_bytes", "planned_peak_bytes")


class RunReadError(ValueError):
    """A directory that cannot be read as a run: bad input to `report`."""


@dataclass
class Series:
    """A run's curves, each (steps, values) with the steps ascending; non-finite values left out."""
    run_dir: Path
    curves: Dict[str, Tuple[List[int], List[float]]]
    overflow_steps: List[int]
    events: List[dict]  # history.jsonl's records: {"event": start|resume|stop|end|failed, "step", ...}
    memory_source: Optional[str]  # "host_rss" | "device" (training/loop.py)
    loss_scaling: bool  # the recipe scales the loss (strategies.precision.loss_scale not none)
    objective: str
    recipe: dict = field(default_factory=dict)
    note: Optional[str] = None  # what could not be read (a last line cut by a kill)

    @property
    def objective_metrics(self) -> List[str]:
        return [name for name in self.curves if name not in COMMON]

    @property
    def last_step(self) -> int:
        return max(self.curves["loss"][0], default=0)


def read_records(path: Path) -> Tuple[List[dict], Optional[str]]:
    """The JSON lines of `path`, and a note when its last line was cut (a kill while it was
    written): the records before it are kept. A bad line elsewhere is bad input."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise RunReadError(f"{path}: cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise RunReadError(f"{path}: not UTF-8 text") from None
    records, note = [], None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not an object")
        except ValueError:
            if number == len(lines):
                note = f"{path.name}: line {number}, the last, is cut short (a kill while it was written); read up to it"
                break
            raise RunReadError(f"{path}: line {number} is not a JSON object") from None
        records.append(record)
    return records, note


def stored_choices(run_dir: Path) -> dict:
    """The run's recipe.yaml as a plain mapping ({} when absent or unreadable)."""
    try:
        recipe = yaml.safe_load((run_dir / "recipe.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return {}
    return recipe if isinstance(recipe, dict) else {}


def curves_of(records: List[dict]) -> Dict[str, Tuple[List[int], List[float]]]:
    """name -> (steps, values) for every number the records hold (NOT_CURVES aside), in step order."""
    curves: Dict[str, Tuple[List[int], List[float]]] = {}
    for record in sorted(records, key=lambda r: r.get("step", 0)):
        step = record.get("step")
        if not isinstance(step, int):
            continue
        for name, value in record.items():
            # a number (not a bool, whose type is not int's) and finite; this loop runs a million times a long run
            if name in NOT_CURVES or type(value) not in (int, float) or not math.isfinite(value):
                continue
            steps, values = curves.setdefault(name, ([], []))
            steps.append(step)
            values.append(float(value))
    curves.setdefault("loss", ([], []))
    return curves


def run_series(run_dir: Path) -> Series:
    """The series of the run in `run_dir` (RunReadError: not a run, or no metrics yet)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunReadError(f"{run_dir}: no such directory")
    if not (run_dir / "recipe.yaml").is_file():
        raise RunReadError(f"{run_dir}: not a run directory (no recipe.yaml; `llama-npu train` writes one)")
    if not (run_dir / METRICS).is_file():
        raise RunReadError(f"{run_dir}: no {METRICS} yet (the run has not finished a step)")
    records, note = read_records(run_dir / METRICS)
    if not any(isinstance(r.get("step"), int) for r in records):
        raise RunReadError(f"{run_dir / METRICS}: no step recorded yet")
    events = read_records(run_dir / HISTORY)[0] if (run_dir / HISTORY).is_file() else []
    recipe = stored_choices(run_dir)
    precision = recipe.get("strategies", {}).get("precision", {}) if isinstance(recipe.get("strategies"), dict) else {}
    sources = [r["memory_source"] for r in records if isinstance(r.get("memory_source"), str)]
    return Series(run_dir=run_dir, curves=curves_of(records),
                  overflow_steps=[r["step"] for r in records if r.get("overflow") is True and "step" in r],
                  events=[e for e in events if isinstance(e.get("step"), int)],
                  memory_source=sources[-1] if sources else None,
                  loss_scaling=str(precision.get("loss_scale", "none")) != "none",
                  objective=str(recipe.get("train", {}).get("objective", "sft")), recipe=recipe, note=note)
