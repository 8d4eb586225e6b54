"""`llama-npu report RUN [RUN ...] [-o FILE.html]`: one self-contained HTML page comparing runs
(pictures inline as data: URIs, no script, nothing fetched), and the same comparison as a short
text table for the terminal. Runs are read, never changed."""
from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Callable, Dict, List

from .pictures import figure, finish, plot_curve, plot_loss, plot_memory, run_pictures, segment_starts
from .run_facts import checkpoints, measured_and_planned, recipe_choices, summary_of
from .series import RunReadError, Series, run_series

STYLE = """body{font-family:sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.2em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;
font-size:13px;vertical-align:top}th{background:#f3f3f3}img{max-width:100%;border:1px solid #eee;margin:4px 0}
.grid img{width:49%}.note{color:#a60}.bad{color:#b00}.ok{color:#070}h2{border-bottom:1px solid #ccc;margin-top:2em}"""
GIB = 2 ** 30


def read_runs(paths: List[Path]) -> List[Series]:
    """Every run's series; RunReadError (bad input) for a directory that is not a run or has no
    metrics yet, and for runs whose objectives give their losses no common axis."""
    runs = [run_series(Path(p)) for p in paths]
    objectives = {s.objective for s in runs}
    if len(objectives) > 1:
        named = ", ".join(f"{s.run_dir} ({s.objective})" for s in runs)
        raise RunReadError(f"report: the runs train different objectives ({named}), whose losses share no axis; "
                           f"report each objective's runs apart")
    return runs


def names(runs: List[Series]) -> List[str]:
    """Each run's name on the page: its directory's name, or its path where two names are alike."""
    short = [s.run_dir.name for s in runs]
    return [name if short.count(name) == 1 else str(s.run_dir) for name, s in zip(short, runs)]


def overlays(runs: List[Series], labels: List[str]) -> Dict[str, bytes]:
    """title -> PNG of each quantity with every run's curve on one axis, each run named."""
    pictures = {}
    drawn = [("loss", lambda ax, s, label, color: plot_loss(ax, s, f"{label}: ", color)),
             ("learning rate", lambda ax, s, label, color: plot_curve(ax, s, "lr", label, color)),
             ("gradient norm", lambda ax, s, label, color: plot_curve(ax, s, "grad_norm", label, color)),
             ("tokens/s (compiling steps left out)",
              lambda ax, s, label, color: plot_curve(ax, s, "tokens_per_s", label, color, skip_compiling=True)),
             ("step time, s (compiling steps left out)",
              lambda ax, s, label, color: plot_curve(ax, s, "step_seconds", label, color, skip_compiling=True)),
             ("peak memory", lambda ax, s, label, color: plot_memory(ax, s, f"{label}: ", color))]
    shared = [name for name in runs[0].objective_metrics if all(name in s.curves for s in runs)]
    for name in shared:
        drawn.append((name, lambda ax, s, label, color, name=name: plot_curve(ax, s, name, label, color)))
    for title, draw in drawn:
        fig, axes = figure()
        for i, (series, label) in enumerate(zip(runs, labels)):
            draw(axes[0], series, label, f"C{i % 10}")
        axes[0].set_ylabel(title if len(title) < 30 else title.split(" (")[0], fontsize=8)
        pictures[title] = finish(fig, axes, f"{title}: {', '.join(labels)}")
    return pictures


def img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def table(header: List[str], rows: List[List[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def fmt(value, digits: int = 4) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}f}" if math.isfinite(value) else str(value)
    return "n/a" if value is None else str(value)


COMPARED = ["run", "objective", "steps", "loss first -> last", "held-out", "tokens/s", "peak GiB", "plan GiB",
            "checkpoints", "stops / resumes"]


def compared_row(series: Series, label: str, saved: list) -> List[str]:
    """One run's line of the comparison: its figures from metrics.jsonl (the whole history)."""
    steps, losses = series.curves["loss"]
    held = series.curves.get("eval_loss", ([], []))[1]
    rates = [v for s, v in zip(*series.curves.get("tokens_per_s", ([], []))) if s not in segment_starts(series)]
    peaks = series.curves.get("peak_memory_bytes", ([], []))[1]
    planned = series.curves.get("planned_peak_bytes", ([], []))[1]
    stops = sum(e.get("event") in ("stop", "failed") for e in series.events)
    resumes = sum(e.get("event") == "resume" for e in series.events)
    return [label, series.objective, str(series.last_step),
            f"{losses[0]:.4f} -> {losses[-1]:.4f}" if losses else "n/a", f"{held[-1]:.4f}" if held else "n/a",
            f"{sorted(rates)[len(rates) // 2]:,.0f}" if rates else "n/a",
            f"{max(peaks) / GIB:.2f}" if peaks else "n/a", f"{planned[-1] / GIB:.2f}" if planned else "n/a",
            f"{sum(reason is None for _, reason in saved)}/{len(saved)} verify", f"{stops} / {resumes}"]


def text_table(rows: List[List[str]]) -> str:
    """The comparison for the terminal: columns as wide as their widest cell."""
    widths = [max(len(row[i]) for row in [COMPARED, *rows]) for i in range(len(COMPARED))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
                     for row in [COMPARED, *rows])


def history_rows(series: Series) -> List[List[str]]:
    return [[html.escape(str(e.get("event"))), str(e["step"]), html.escape(str(e.get("time", ""))),
             html.escape(str(e.get("reason") or e.get("checkpoint") or ""))
             + (f" ({e['discarded_steps']} later steps trained again)" if e.get("discarded_steps") else "")]
            for e in series.events]


def run_section(series: Series, label: str, saved: list, plan_arguments: Callable) -> str:
    """One run's part of the page: choices, summary, plan beside measured (`plan_arguments`:
    run_facts.planned_step_seconds), checkpoints, history and its own pictures."""
    summary = summary_of(series.run_dir)
    parts = [f'<h2 id="{html.escape(label)}">{html.escape(label)}</h2>',
             f"<p>{html.escape(str(series.run_dir.resolve()))}</p>"]
    if series.note:
        parts.append(f'<p class="note">note: {html.escape(series.note)}</p>')
    parts.append(table(["recipe", "value"], [[html.escape(k), html.escape(v)] for k, v in
                                             recipe_choices(series.recipe)]))
    shown = {k: v for k, v in summary.items() if k in ("steps", "steps_this_run", "stopped_by", "first_loss",
                                                       "last_loss", "eval_loss", "tokens_per_s", "checkpoint")}
    parts.append(table(["summary.json (the last process)", "value"],
                       [[html.escape(k), html.escape(fmt(v))] for k, v in shown.items()]))
    planned = measured_and_planned(series, summary, plan_arguments)
    parts.append(table(["", "plan", "measured"], [[html.escape(c) for c in row] for row in planned]))
    parts.append(table(["checkpoint", "verifies (every file against its CRC-32)"],
                       [[html.escape(path), '<span class="ok">yes</span>' if reason is None else
                         f'<span class="bad">no: {html.escape(reason)}</span>'] for path, reason in saved]
                       or [["none", ""]]))
    parts.append(table(["event", "step", "time", "reason / checkpoint"], history_rows(series) or
                       [["no history.jsonl (a run from before it was kept)", "", "", ""]]))
    parts += [img(png, f"{label}: {name}") for name, png in run_pictures(series).items()]
    return "\n".join(parts)


def write_report(paths: List[Path], out: Path, plan_arguments: Callable) -> str:
    """Write the page to `out`; the text table to print. `plan_arguments(recipe)`: what
    `plan RECIPE --json` parses (commands/plan.py, json_arguments), to plan each run's recipe."""
    from ..common.atomic import replace_file

    runs = read_runs(paths)
    labels = names(runs)
    saved = [checkpoints(s.run_dir) for s in runs]
    rows = [compared_row(s, label, c) for s, label, c in zip(runs, labels, saved)]
    body = [f"<h1>llama-npu report: {html.escape(', '.join(labels))}</h1>",
            table(COMPARED, [[html.escape(c) for c in row] for row in rows]),
            "<h2>Curves, every run on one axis</h2>"]
    body += ['<div class="grid">', *[img(png, title) for title, png in overlays(runs, labels).items()], "</div>"]
    body += [run_section(s, label, c, plan_arguments) for s, label, c in zip(runs, labels, saved)]
    page = (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>llama-npu report</title>'
            f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
    replace_file(out, lambda tmp: tmp.write_text(page, encoding="utf-8"))
    notes = [f"note: {s.run_dir}: {s.note}" for s in runs if s.note]
    return "\n".join([text_table(rows), *notes, f"wrote {out}"])
