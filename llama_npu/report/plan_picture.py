"""`llama-npu plan ... --plot FILE.png`: the plan as a picture, read from plan's own JSON and
the planner's phase terms (memory/planner.py phase_terms): for each phase the memory alive
at its peak, stacked by component, against a line at the card's usable memory, the margin on
the peak phase; the communication buffers, which live outside that pool, apart beside the HBM
the pool leaves them; with the optimizer on the host, the host's bytes; with --fit, the recipe
as given beside the recommended plan; where plan predicts a step time, its parts."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import List, Tuple

from .pictures import write_atomically

GIB = 2 ** 30


def plan_jsons(args) -> List[Tuple[str, dict]]:
    """(title, plan JSON) of what `args` plans: the plan, or with --fit the recipe as given
    (where its layout fits the devices) and the recommended or closest plan."""
    from ..memory.plan_report import run_plan

    quiet = argparse.Namespace(**{**vars(args), "json": True, "write_recipe": None, "overwrite": False})
    result = json.loads(run_plan(quiet)[0])
    plans = [("as given" if args.fit else "plan", result)] if "components" in result else []
    if args.fit and result.get("recommended") and not result.get("unchanged"):
        plans.append(("recommended", result["recommended"]))
    return plans


def terms(plan: dict) -> dict:
    """phase -> {component: bytes} of a plan JSON (one "inference" phase for --task inference)."""
    from ..memory.planner import Strategy, phase_terms

    c = plan["components"]
    if not plan.get("phases"):
        return {"inference": {k: v for k, v in c.items() if v and k not in ("margin", "communication_buffers")}}
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in plan["strategy"].items()}
    return phase_terms(c, Strategy(**{k: v for k, v in fields.items() if k in Strategy.__dataclass_fields__}))


def colors_of(names: List[str]) -> dict:
    from matplotlib import colormaps

    palette = colormaps["tab20"]
    return {name: palette(i % 20) for i, name in enumerate(sorted(names))}


def device_panel(ax, plans: List[Tuple[str, dict]]) -> None:
    """Stacked bars per phase, the usable memory as a line, the margin on each plan's peak phase."""
    stacks = [(title, plan, terms(plan)) for title, plan in plans]
    colors = colors_of(list({name for _, _, phases in stacks for alive in phases.values() for name in alive}))
    x, ticks, labelled = 0, [], set()
    for title, plan, phases in stacks:
        peak = max(phases, key=lambda p: sum(phases[p].values()))
        for phase, alive in phases.items():
            bottom = 0
            for name, n in alive.items():
                ax.bar(x, n / GIB, bottom=bottom / GIB, color=colors[name], width=0.7,
                       label=name if name not in labelled else None)
                labelled.add(name)
                bottom += n
            if phase == peak and plan["components"].get("margin"):
                ax.bar(x, plan["components"]["margin"] / GIB, bottom=bottom / GIB, width=0.7, fill=False,
                       hatch="//", edgecolor="grey", label="margin (10% of usable)" if "margin" not in labelled else None)
                labelled.add("margin")
            ticks.append((x, f"{phase}\n{title}" if len(plans) > 1 else phase))
            x += 1
        ax.hlines(plan["device_bytes"] / GIB, x - len(phases) - 0.45, x - 0.55, colors="black", linewidth=2)
        ax.annotate(f"usable {plan['device_bytes'] / GIB:.2f} GiB ({'fits' if plan['fits'] else 'does not fit'})",
                    (x - len(phases) - 0.45, plan["device_bytes"] / GIB), textcoords="offset points", xytext=(0, 4),
                    fontsize=8)
        x += 0.6
    ax.set_xticks([t for t, _ in ticks], [label for _, label in ticks], fontsize=8)
    ax.set_ylabel("GiB per device (in the pool)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def outside_panel(ax, plans: List[Tuple[str, dict]]) -> None:
    """The communication buffers (HCCL's, outside the pool) against the HBM the pool leaves."""
    for i, (title, plan) in enumerate(plans):
        room = (plan.get("hbm_bytes", plan["device_bytes"]) - plan["device_bytes"]) / GIB
        ax.bar(i, plan.get("outside_pool_bytes", 0) / GIB, width=0.6, color="tab:purple")
        ax.hlines(room, i - 0.4, i + 0.4, colors="black", linewidth=2)
    ax.set_xticks(range(len(plans)), [t for t, _ in plans], fontsize=8)
    ax.set_title("outside the pool:\ncommunication buffers\n(line: HBM left)", fontsize=8)


def stacked_row(ax, rows: List[Tuple[str, dict]], unit: float, xlabel: str) -> None:
    """One horizontal stacked bar a row of {part: amount}, each part labelled once."""
    colors = colors_of(list({name for _, parts in rows for name in parts}))
    labelled = set()
    for y, (title, parts) in enumerate(rows):
        left = 0.0
        for name, amount in parts.items():
            ax.barh(y, amount / unit, left=left / unit, color=colors[name], height=0.6,
                    label=name if name not in labelled else None)
            labelled.add(name)
            left += amount
    ax.set_yticks(range(len(rows)), [t for t, _ in rows], fontsize=8)
    ax.set_xlabel(xlabel)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def host_rows(plans) -> List[Tuple[str, dict]]:
    return [(title, {k: v for k, v in plan["host"]["components"].items() if v})
            for title, plan in plans if plan.get("host")]


def step_rows(plans) -> List[Tuple[str, dict]]:
    """Plan's predicted step time by part, where its JSON has one (parts of unknown seconds left out)."""
    rows = []
    for title, plan in plans:
        parts = (plan.get("step_time") or {}).get("parts") or {}
        known = {k: v for k, v in parts.items() if isinstance(v, (int, float)) and v > 0}
        if known:
            rows.append((title, known))
    return rows


def draw_plan(args) -> str:
    """Write args.plot; the line saying so."""
    from matplotlib.figure import Figure

    plans = plan_jsons(args)
    hosts, steps = host_rows(plans), step_rows(plans)
    heights = [4.2] + [1.2 + 0.5 * len(hosts)] * bool(hosts) + [1.2 + 0.5 * len(steps)] * bool(steps)
    fig = Figure(figsize=(10, sum(heights) + 0.8))
    grid = fig.add_gridspec(len(heights), 2, height_ratios=heights, width_ratios=[5, 1])
    device_panel(fig.add_subplot(grid[0, 0]), plans)
    outside_panel(fig.add_subplot(grid[0, 1]), plans)
    row = 1
    if hosts:
        stacked_row(fig.add_subplot(grid[row, 0]), hosts, GIB, "GiB on the host, one rank (optimizer on the host)")
        row += 1
    if steps:
        stacked_row(fig.add_subplot(grid[row, 0]), steps, 1.0, "predicted step time, s (parts add)")
    first = plans[0][1]
    fig.suptitle(f"plan: {first['model']} on {first['device']} x {first['devices']}", fontsize=10)
    fig.tight_layout()
    out = Path(args.plot)
    import io

    data = io.BytesIO()
    fig.savefig(data, format="png", dpi=100)
    write_atomically(out, data.getvalue())
    return f"wrote {out}"
