"""`llama-npu profile`: a recipe trained under each strategy combination, measured.

Each combination trains in its own `llama-npu train` process: its peak memory is that
process's own, and a crash or an out-of-memory kill becomes a row with its error while the
profile goes on. Beside every measurement stands the planner's prediction for the same
settings. A combination the recipe validation refuses is a row saying why, never run.

The runs skip evaluation (data.eval_files=[]) so that only training is measured; their
checkpoints are deleted once measured, as a profile's weights are of no use.
"""
from __future__ import annotations

import collections
import difflib
import itertools
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable, Dict, List, Optional

from ..checkpoints.files import checkpoint_root
from ..common.atomic import check_writable, replace_file
from ..common.console import note
from ..memory.parameter_count import cached_parameter_count
from ..memory.planned_peak import planned_peak_bytes
from ..model.architecture import resolve_shape
from ..recipe.load import load_recipe
from ..recipe.problems import RecipeError
from ..recipe.schema import Recipe
from ..strategies import STRATEGIES

GiB = 2 ** 30
SWITCHES = ("off", "on")
# How out-of-memory failures read: MindSpore on Ascend, on the host, and Python's own.
OUT_OF_MEMORY = re.compile(r"out of memory|memory isn't enough|memory is not enough|MemoryError|"
                           r"alloc(ate)? (device )?memory failed", re.IGNORECASE)
ERROR_LINE = re.compile(r"^(llama-npu: error: |([\w.]+)?(Error|Exception)\b)")


class ProfileError(RecipeError):
    """Bad `profile` arguments (--combos, --steps): bad input like a bad recipe, so the CLI
    reports it the same way (one line, exit 2)."""


# ---------------------------------------------------------------- axes: value -> --set overrides

def _switch(key: str) -> Callable[[str, Recipe], List[str]]:
    return lambda value, base: [f"{key}={'true' if value == 'on' else 'false'}"]


@dataclass(frozen=True)
class Axis:
    overrides: Callable[[str, Recipe], List[str]]
    check: Callable[[str], bool]
    expected: str


def _axis(strategy) -> Axis:
    """A strategy's axis: its on/off switch, or its own values."""
    if hasattr(strategy, "PROFILE_SWITCH"):
        return Axis(_switch(strategy.PROFILE_SWITCH), SWITCHES.__contains__, "off or on")
    return Axis(strategy.profile_overrides, strategy.profile_value_ok, strategy.PROFILE_EXPECTED)


AXES: Dict[str, Axis] = {strategy.KEY: _axis(strategy) for strategy in STRATEGIES
                         if hasattr(strategy, "PROFILE_SWITCH") or hasattr(strategy, "profile_overrides")}


def axis_overrides(axis: str, value: str, base: Recipe) -> List[str]:
    """A named axis maps onto its recipe keys; a dotted axis is itself a recipe key."""
    return AXES[axis].overrides(value, base) if axis in AXES else [f"{axis}={value}"]


# ---------------------------------------------------------------- the matrix

def parse_combos(spec: str, recipe_path: Path, sets: List[str]) -> Dict[str, List[str]]:
    """'axis=v1,v2;axis=v1' -> {axis: [values]}, checked; ProfileError names what is wrong.

    An axis is one of AXES or any recipe key (e.g. train.micro_batch_size=1,2,4); each value
    of a recipe key must be valid on its own."""
    axes: Dict[str, List[str]] = {}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        axis, sep, raw = (s.strip() for s in part.partition("="))
        values = [v.strip() for v in raw.split(",") if v.strip()]
        if not sep or not values:
            raise ProfileError(f"--combos: '{part}' needs values, e.g. {axis or 'precision'}=O0,O2")
        if axis in axes:
            raise ProfileError(f"--combos: axis '{axis}' is given twice")
        if axis in AXES:
            bad = [v for v in values if not AXES[axis].check(v)]
            if bad:
                raise ProfileError(f"--combos: {axis}={bad[0]}: expected {AXES[axis].expected}")
        elif "." in axis:
            for value in values:
                try:
                    load_recipe(recipe_path, [*sets, f"{axis}={value}"])
                except RecipeError as exc:
                    raise ProfileError(f"--combos: {axis}={value}: {exc}") from None
        else:
            close = difflib.get_close_matches(axis, list(AXES), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ProfileError(f"--combos: unknown axis '{axis}'{hint}; the axes are {', '.join(AXES)}, "
                               f"or a recipe key such as train.micro_batch_size")
        axes[axis] = values
    if not axes:
        raise ProfileError("--combos: no axis given, e.g. precision=O0,O2;chunked_ce=off,on")
    return axes


def _accepts(recipe_path: Path, sets: List[str], base: Recipe, axis: str, value: str) -> Optional[str]:
    """None when the recipe validates with this one axis value, else the refusal."""
    try:
        load_recipe(recipe_path, [*sets, *axis_overrides(axis, value, base)])
        return None
    except RecipeError as exc:
        return str(exc)


def default_axes(recipe_path: Path, sets: List[str], base: Recipe) -> tuple[Dict[str, List[str]], List[str]]:
    """The default matrix and notes on what it left out: full precision and a mixed level
    this device runs (the recipe's dtype, else float16), 1 and 4 micro-batches, recompute,
    chunked cross-entropy, and LoRA when the recipe takes it."""
    notes = []
    mixed = "O2" if _accepts(recipe_path, sets, base, "precision", "O2") is None else "O2:float16"
    axes = {"precision": ["O0", mixed], "accumulation": ["1", "4"], "recompute": ["off", "on"],
            "chunked_ce": ["off", "on"]}
    refusal = _accepts(recipe_path, sets, base, "lora", "on")
    if refusal is None:
        axes["lora"] = ["off", "on"]
    else:
        notes.append(f"lora axis left out: {refusal}")
    return axes, notes


@dataclass
class Combo:
    values: Dict[str, str]  # axis -> value, in the order of the axes

    @property
    def label(self) -> str:
        return ", ".join(f"{axis}={value}" for axis, value in self.values.items())

    @property
    def slug(self) -> str:
        text = "_".join(f"{axis.rsplit('.', 1)[-1]}-{value}" for axis, value in self.values.items())
        return re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:120]  # a directory name; the index keeps it unique

    def overrides(self, base: Recipe) -> List[str]:
        return [o for axis, value in self.values.items() for o in axis_overrides(axis, value, base)]


def combinations(axes: Dict[str, List[str]]) -> List[Combo]:
    return [Combo(dict(zip(axes, values))) for values in itertools.product(*axes.values())]


# ---------------------------------------------------------------- one combination

def train_command(recipe_path: Path, run_dir: Path, overrides: List[str]) -> List[str]:
    command = [sys.executable, "-m", "llama_npu", "train", str(recipe_path), "--output-dir", str(run_dir),
               "--overwrite"]
    return command + [arg for o in overrides for arg in ("--set", o)]


def error_line(stderr: str) -> str:
    """The line that says what went wrong: the exception (MindSpore follows its message with
    C++ stack lines, and tqdm leaves its bar on the last line), else the last line."""
    lines = [line.strip() for line in re.split(r"[\r\n]+", stderr) if line.strip()]
    for line in reversed(lines):
        if ERROR_LINE.match(line):
            return line
    return lines[-1] if lines else "(no error output)"


def classify_failure(returncode: int, stderr: str) -> tuple[str, str]:
    """(status, error) of a training process that did not exit 0."""
    if returncode == -signal.SIGKILL:
        # SIGKILL is what the kernel's out-of-memory killer sends; nothing is printed.
        return "out_of_memory", "killed by SIGKILL (most likely the kernel's out-of-memory killer)"
    if returncode < 0:
        return "failed", f"killed by signal {signal.Signals(-returncode).name}"
    line = error_line(stderr)
    if OUT_OF_MEMORY.search(stderr):
        return "out_of_memory", f"out of memory: {line}"
    return "failed", line


def measure_run(run_dir: Path) -> dict:
    """The figures of one finished run, from its metrics.jsonl. Step 1 compiles the graphs;
    the steps after it are the timed ones."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
               if line.strip()]
    first, timed = records[0], records[1:]
    median = statistics.median(r["step_seconds"] for r in timed)
    seconds = sum(r["step_seconds"] for r in timed)
    tokens = sum(r["tokens_per_s"] * r["step_seconds"] for r in timed)
    last_loss = records[-1]["loss"]
    return {"compile_seconds": max(first["step_seconds"] - median, 0.0), "first_step_seconds": first["step_seconds"],
            "median_step_seconds": median, "tokens_per_s": tokens / seconds, "timed_steps": len(timed),
            "peak_memory_bytes": max(r["peak_memory_bytes"] for r in records),
            "memory_source": records[-1]["memory_source"], "last_loss": last_loss,
            "loss_finite": math.isfinite(last_loss), "overflow_steps": sum(bool(r["overflow"]) for r in records)}


def planned_bytes(recipe: Recipe) -> int:
    """The planner's per-device peak, exactly as the training run logs it."""
    shape = resolve_shape(recipe.model)
    return planned_peak_bytes(recipe, shape, cached_parameter_count(shape))


def run_combo(recipe_path: Path, overrides: List[str], run_dir: Path) -> dict:
    """Train one combination in its own process; its figures, or its error."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(train_command(recipe_path, run_dir, overrides), capture_output=True, text=True)
    (run_dir.parent / f"{run_dir.name}.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    if proc.returncode != 0:
        status, error = classify_failure(proc.returncode, proc.stderr)
        return {"status": status, "error": error}
    shutil.rmtree(checkpoint_root(run_dir), ignore_errors=True)
    return {"status": "ok", "error": None, **measure_run(run_dir)}


# ---------------------------------------------------------------- the profile

def describe_machine(target: str) -> dict:
    import psutil  # imported here: only the profile's machine block reads it

    cpu = platform.processor() or platform.machine()
    if Path("/proc/cpuinfo").is_file():
        names = re.findall(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
        cpu = names[0].strip() if names else cpu
    return {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(),
            "memory_bytes": psutil.virtual_memory().total, "python": platform.python_version(),
            "mindspore": metadata.version("mindspore"), "mindformers": metadata.version("mindformers"),
            "backend": target}


def duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class TimeLeft:
    """The time the pending combinations will take, at the mean of those run so far."""

    def __init__(self, pending: int):
        self.pending, self.ran, self.seconds = pending, 0, 0.0

    def skipped(self) -> None:
        self.pending -= 1

    def ran_one(self, seconds: float) -> None:
        self.pending, self.ran, self.seconds = self.pending - 1, self.ran + 1, self.seconds + seconds

    def __str__(self) -> str:
        return f" (about {duration(self.pending * self.seconds / self.ran)} left)" if self.ran else ""


def run_settings(combo: Combo, base: Recipe, sets: List[str], steps: int) -> List[str]:
    """Every --set of one combination's run: the profile's own (no evaluation; --steps decides
    the length; one checkpoint, at the end), the user's, and the combination's."""
    # Timing needs no trained base: LoRA over random weights is measured as over real ones.
    random_base = [] if base.model.checkpoint else ["model.random_init=true"]
    return ["data.eval_files=[]", *sets, *random_base, *combo.overrides(base),
            "train.epochs=null", f"train.max_steps={steps + 1}", f"train.save_every={steps + 1}"]


def run_profile(recipe_path: Path, combos_spec: Optional[str], steps: int, out_dir: Path, sets: List[str],
                progress: Callable[[str], None] = note) -> dict:
    """Train every combination for 1 + `steps` steps, write profile.json, .md and .png into
    `out_dir` (rewritten after each combination, so an interrupted profile keeps what it
    measured) and return the profile."""
    if steps < 1:
        raise ProfileError(f"--steps: expected at least 1 timed step, got {steps}")
    check_writable(Path(out_dir), "--out")
    recipe_path = Path(recipe_path)
    base = load_recipe(recipe_path, sets)
    par = base.strategies.parallel
    if par.data * par.model * par.pipeline > 1:
        raise ProfileError(f"{recipe_path}: its layout needs {par.data * par.model * par.pipeline} devices (msrun), "
                           f"and profile trains each combination in one process; profile the per-device "
                           f"settings with --set strategies.parallel.data=1 (and model, pipeline)")
    if combos_spec is None:
        axes, notes = default_axes(recipe_path, sets, base)
    else:
        axes, notes = parse_combos(combos_spec, recipe_path, sets), []
    profile = {"recipe": str(recipe_path), "steps": steps, "set": sets, "axes": axes, "notes": notes,
               "machine": describe_machine(base.device.target), "rows": []}
    combos = combinations(axes)
    left = TimeLeft(len(combos))
    for index, combo in enumerate(combos, 1):
        row = {"index": index, "combination": combo.values, "label": combo.label}
        profile["rows"].append(row)
        heading = f"profile {index}/{len(combos)}: {combo.label}"
        try:
            settings = run_settings(combo, base, sets, steps)
            recipe = load_recipe(recipe_path, settings)
        except RecipeError as exc:
            row.update(status="skipped", error=f"refused by the recipe validation: {exc}")
            left.skipped()
            progress(f"{heading}: skipped ({exc})")
            continue
        run_dir = out_dir / "runs" / f"{index:02d}_{combo.slug}"
        row.update(overrides=combo.overrides(base), planned_peak_bytes=planned_bytes(recipe), run_dir=str(run_dir),
                   command=shlex.join(["llama-npu", *train_command(recipe_path, run_dir, settings)[3:]]))
        progress(f"{heading}{left}")
        begin = time.perf_counter()
        row.update(run_combo(recipe_path, settings, run_dir))
        row["wall_seconds"] = time.perf_counter() - begin
        left.ran_one(row["wall_seconds"])
        progress(f"  {describe_row(row)}")
        write_reports(profile, out_dir)
    write_reports(profile, out_dir)
    return profile


def describe_row(row: dict) -> str:
    if row["status"] != "ok":
        return f"{row['status']}: {row['error']}"
    return (f"ok: {row['median_step_seconds']:.3f} s/step, {row['tokens_per_s']:,.0f} tokens/s, peak "
            f"{row['peak_memory_bytes'] / GiB:.2f} GiB {row['memory_source']} (planned "
            f"{row['planned_peak_bytes'] / GiB:.2f} GiB), compile {row['compile_seconds']:.1f} s")


# ---------------------------------------------------------------- reports

def write_reports(profile: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    replace_file(out_dir / "profile.json",
                 lambda p: p.write_text(json.dumps(profile, indent=2, ensure_ascii=False), encoding="utf-8"))
    replace_file(out_dir / "profile.md", lambda p: p.write_text(format_markdown(profile), encoding="utf-8"))
    replace_file(out_dir / "profile.png", lambda p: plot(profile, p))


MEMORY_SOURCES = {  # metrics' memory_source -> (legend of the plot, note in the table's header)
    "device": ("device memory", "Peak memory is the device counter (mindspore.runtime.max_memory_allocated)."),
    "host_rss": ("host RSS, not NPU memory", "Peak memory is the training process's host RSS: on the CPU backend "
                 "it is not NPU memory and no proxy for it; the planned column is the planner's prediction "
                 "for the device."),
    None: ("none measured", "No combination was measured."),
}


def memory_source(rows: List[dict]) -> Optional[str]:
    """The source of the measured rows' peaks (one backend: one source), if any was measured."""
    return next((row["memory_source"] for row in rows if row.get("memory_source")), None)


def format_markdown(profile: dict) -> str:
    m = profile["machine"]
    sets = " ".join(f"--set {s}" for s in profile["set"])
    lines = [f"Measured by `llama-npu profile {profile['recipe']}{' ' + sets if sets else ''}` on {m['cpu']}, "
             f"{m['cores']} cores, {m['memory_bytes'] / GiB:.0f} GiB ({m['platform']}); MindSpore {m['mindspore']}, "
             f"backend {m['backend']}; median of {profile['steps']} steps after the compiling first. "
             + MEMORY_SOURCES[memory_source(profile["rows"])][1], ""]
    lines += [f"Note: {note}" for note in profile["notes"]]
    lines += ["| # | combination | compile s | median step s | tokens/s | peak GiB (source) | planned GiB "
              "| loss finite | error |", "|---|---|---|---|---|---|---|---|---|"]
    for row in profile["rows"]:
        planned = f"{row['planned_peak_bytes'] / GiB:.2f}" if row.get("planned_peak_bytes") else "-"
        if row["status"] == "ok":
            cells = [f"{row['compile_seconds']:.1f}", f"{row['median_step_seconds']:.3f}", f"{row['tokens_per_s']:,.0f}",
                     f"{row['peak_memory_bytes'] / GiB:.2f} ({row['memory_source']})", planned,
                     "yes" if row["loss_finite"] else "**no**", ""]
        else:
            cells = ["-", "-", "-", "-", planned, "-", f"{row['status']}: {row['error']}".replace("|", "\\|")]
        lines.append(f"| {row['index']} | {row['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(profile: dict, path: Path) -> None:
    """Two panels over the combinations: measured and planned peak memory, and tokens/s.
    A combination without a measurement is labelled with its status where its bar would be."""
    import matplotlib  # imported here: only the chart needs it (about 0.5 s)

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    rows = profile["rows"]
    labels = [f"{row['index']}. {row['label']}" for row in rows]
    y = list(range(len(rows)))
    fig, (mem, speed) = plt.subplots(1, 2, sharey=True, figsize=(14, 1.5 + 0.32 * len(rows)))
    measured = [row.get("peak_memory_bytes", 0) / GiB for row in rows]
    planned = [(row.get("planned_peak_bytes") or 0) / GiB for row in rows]
    mem.barh([i - 0.2 for i in y], measured, height=0.4, label=f"measured ({MEMORY_SOURCES[memory_source(rows)][0]})")
    mem.barh([i + 0.2 for i in y], planned, height=0.4, label="planned (planner)")
    mem.set_xlabel("peak memory, GiB")
    mem.legend(loc="lower right", fontsize=8)
    speed.barh(y, [row.get("tokens_per_s", 0) for row in rows], height=0.6, color="tab:green")
    speed.set_xlabel("tokens/s (after the compiling first step)")
    for i, row in enumerate(rows):
        if row["status"] != "ok":
            for ax in (mem, speed):
                ax.plot(0, i, marker="x", color="tab:red", clip_on=False)
                ax.annotate(row["status"].replace("_", " "), (0, i), xytext=(6, -3), textcoords="offset points",
                            color="tab:red", fontsize=8)
    mem.set_yticks(y, labels, fontsize=7)
    mem.invert_yaxis()  # first combination on top, as in the table
    m = profile["machine"]
    fig.suptitle(f"llama-npu profile {profile['recipe']}: {m['backend']} backend, {m['cores']} cores, "
                 f"median of {profile['steps']} steps", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)


def format_result(profile: dict, out_dir: Path) -> str:
    counts = collections.Counter(row["status"] for row in profile["rows"])
    tally = ", ".join(f"{n} {status.replace('_', ' ')}" for status, n in counts.items())
    return (format_markdown(profile) + f"\n{len(profile['rows'])} combinations: {tally}\n"
            f"wrote {out_dir / 'profile.json'}, {out_dir / 'profile.md'}, {out_dir / 'profile.png'}")
