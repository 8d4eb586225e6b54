"""A run's pictures, RUN/images/*.png, drawn from `series.run_series` with matplotlib's Agg
backend (files only, no display): the loss (raw, smoothed, the held-out loss where it was
measured), the learning rate, the gradient norm, throughput and step time, memory against the
plan, the loss scale when the recipe scales the loss, and each group of the objective's own
metrics as it logs them. Resumes and stops are marked on every step axis."""
from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .series import Series, run_series

IMAGES = "images"
MOST_POINTS = 2000  # a 6.4-inch axis at 100 dpi shows fewer; longer curves are thinned to this
EVENT_STYLE = {"resume": ("tab:green", "--", "resumed"), "stop": ("tab:orange", ":", "stopped"),
               "failed": ("tab:red", ":", "failed")}
GIB = 2 ** 30
MEMORY_LABELS = {"host_rss": "host peak RSS (CPU backend: no proxy for NPU memory)",
                 "device": "device memory (mindspore.runtime.max_memory_allocated)"}


def thinned(steps: List[int], values: List[float], most: int = MOST_POINTS) -> Tuple[List[int], List[float]]:
    """Every k-th point (and the last) of a curve longer than `most`."""
    if len(steps) <= most:
        return steps, values
    k = -(-len(steps) // most)
    keep = list(range(0, len(steps), k))
    if keep[-1] != len(steps) - 1:
        keep.append(len(steps) - 1)
    return [steps[i] for i in keep], [values[i] for i in keep]


def smoothed(values: List[float]) -> List[float]:
    """An exponential moving average over about a twentieth of the curve, debiased at its
    start (as TensorBoard's smoothing), so that the trend shows through step-to-step noise."""
    decay = 1 - 1 / max(1, len(values) // 20)
    out, mean, weight = [], 0.0, 0.0
    for value in values:
        mean = decay * mean + (1 - decay) * value
        weight = decay * weight + (1 - decay)
        out.append(mean / weight)
    return out


def segment_starts(series: Series) -> set:
    """The first step of each process (start or resume): it includes the graph's compilation."""
    starts = {e["step"] + 1 for e in series.events if e.get("event") in ("start", "resume")}
    return starts or {1}


def mark_events(ax, series: Series) -> None:
    """A vertical line at each resume and stop, labelled with its step (and reason)."""
    for event in series.events:
        style = EVENT_STYLE.get(event.get("event"))
        if style:
            color, line, what = style
            reason = f" ({event['reason']})" if event.get("reason") and what != "resumed" else ""
            ax.axvline(event["step"], color=color, linestyle=line, linewidth=1,
                       label=f"{what} at step {event['step']}{reason}"[:80])


def plot_loss(ax, series: Series, label: str = "", color=None) -> None:
    steps, values = series.curves["loss"]
    raw_steps, raw = thinned(steps, values)
    line = ax.plot(raw_steps, raw, alpha=0.3 if len(steps) > 1 else 1, linewidth=1, color=color,
                   marker="o" if len(steps) == 1 else None, label=f"{label}loss (raw)")[0]
    if len(steps) > 2:
        ax.plot(*thinned(steps, smoothed(values)), color=line.get_color(), linewidth=2, label=f"{label}loss (smoothed)")
    eval_steps, eval_values = series.curves.get("eval_loss", ([], []))
    if eval_steps:
        ax.plot(eval_steps, eval_values, "s--", color=line.get_color(), markersize=5, linewidth=1,
                markerfacecolor="white", label=f"{label}held-out loss")
    ax.set_ylabel("loss (mean per target token)")


def plot_curve(ax, series: Series, name: str, label: str = "", color=None, skip_compiling: bool = False) -> None:
    steps, values = series.curves.get(name, ([], []))
    if skip_compiling:  # each process's first step includes the compile: seconds, not a rate
        starts = segment_starts(series)
        kept = [(s, v) for s, v in zip(steps, values) if s not in starts]
        steps, values = [s for s, _ in kept], [v for _, v in kept]
    steps, values = thinned(steps, values)
    ax.plot(steps, values, color=color, linewidth=1.2, marker="." if len(steps) < 50 else None,
            label=label.rstrip(": ") or None)


def plot_memory(ax, series: Series, label: str = "", color=None) -> None:
    """The measured peak over the steps against the plan's planned peak, in GiB."""
    steps, peaks = thinned(*series.curves.get("peak_memory_bytes", ([], [])))
    measured = MEMORY_LABELS.get(series.memory_source, "measured peak")
    line = ax.plot(steps, [p / GIB for p in peaks], color=color, linewidth=1.5, label=f"{label}{measured}")[0]
    planned = series.curves.get("planned_peak_bytes", ([], []))[1]
    if planned:
        ax.axhline(planned[-1] / GIB, color=line.get_color(), linestyle="--", linewidth=1,
                   label=f"{label}plan's planned peak, {planned[-1] / GIB:.2f} GiB")
    ax.set_ylabel("GiB")


def plot_loss_scale(ax, series: Series) -> None:
    """The scale each step used, and the steps skipped on an overflow."""
    steps, scales = series.curves.get("loss_scale", ([], []))
    ax.plot(*thinned(steps, scales), linewidth=1.2, label="loss scale")
    at = dict(zip(steps, scales))
    skipped = [s for s in series.overflow_steps if s in at]
    if skipped:
        ax.plot(skipped, [at[s] for s in skipped], "x", color="tab:red", markersize=7,
                label=f"overflow: step skipped ({len(skipped)})")
    ax.set_yscale("log", base=2)


def metric_groups(names: List[str]) -> Dict[str, List[str]]:
    """The objective's metric names grouped by what precedes their "/" (rewards/chosen and
    rewards/margins together), each group one picture."""
    groups: Dict[str, List[str]] = {}
    for name in names:
        groups.setdefault(name.split("/", 1)[0], []).append(name)
    return groups


def file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) + ".png"


def figure(rows: int = 1):
    """A figure of `rows` axes over one step axis: a matplotlib Figure without pyplot, which
    keeps no global state and needs no display (it renders with Agg)."""
    from matplotlib.figure import Figure  # imported here: only drawing needs it (about 0.5 s)

    fig = Figure(figsize=(7.2, 2.4 + 2.2 * rows))
    axes = fig.subplots(rows, 1, squeeze=False, sharex=True)
    return fig, [row[0] for row in axes]


def finish(fig, axes, title: str, series: Optional[Series] = None) -> bytes:
    """The figure as PNG bytes: events marked, axes labelled, legends where there are labels."""
    for ax in axes:
        if series is not None:
            mark_events(ax, series)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
    from matplotlib.ticker import MaxNLocator

    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))  # steps, not 2.5
    axes[-1].set_xlabel("step")
    axes[0].set_title(title, fontsize=10)
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=100)
    return out.getvalue()


def run_pictures(series: Series) -> Dict[str, bytes]:
    """file name -> PNG bytes of every picture of one run."""
    name = series.run_dir.name
    pictures = {}
    fig, axes = figure()
    plot_loss(axes[0], series)
    pictures["loss.png"] = finish(fig, axes, f"{name}: loss", series)
    for key, title in (("lr", "learning rate"), ("grad_norm", "gradient norm (before clipping)")):
        fig, axes = figure()
        plot_curve(axes[0], series, key)
        axes[0].set_ylabel(title)
        pictures[file_name(key)] = finish(fig, axes, f"{name}: {title}", series)
    fig, axes = figure(2)
    plot_curve(axes[0], series, "tokens_per_s", skip_compiling=True)
    plot_curve(axes[1], series, "step_seconds", skip_compiling=True)
    axes[0].set_ylabel("tokens/s")
    axes[1].set_ylabel("step time (s)")
    pictures["throughput.png"] = finish(fig, axes, f"{name}: throughput (each process's compiling first step "
                                                   f"left out)", series)
    fig, axes = figure()
    plot_memory(axes[0], series)
    pictures["memory.png"] = finish(fig, axes, f"{name}: peak memory", series)
    if series.loss_scaling:
        fig, axes = figure()
        plot_loss_scale(axes[0], series)
        pictures["loss_scale.png"] = finish(fig, axes, f"{name}: loss scale", series)
    for group, names in metric_groups(series.objective_metrics).items():
        fig, axes = figure(len(names))
        for ax, metric in zip(axes, names):
            plot_curve(ax, series, metric)
            ax.set_ylabel(metric, fontsize=8)
        pictures[file_name(group)] = finish(fig, axes, f"{name}: {group} ({series.objective})", series)
    return pictures


def write_atomically(path: Path, data: bytes) -> None:
    """A picture appears whole or not at all: a report reading it meanwhile never sees half."""
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        partial.write_bytes(data)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def draw_run(run_dir: Path) -> List[Path]:
    """Draw RUN/images/*.png from the run's files; the paths written."""
    series = run_series(Path(run_dir))
    images = Path(run_dir) / IMAGES
    pictures = run_pictures(series)
    images.mkdir(exist_ok=True)
    written = []
    for name, data in pictures.items():
        write_atomically(images / name, data)
        written.append(images / name)
    return written
