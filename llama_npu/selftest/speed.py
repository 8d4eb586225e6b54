"""selftest's speed checks (`--speed`): a 1B step at the shipped recipe's settings for this
SoC (the 910B4: the 910B's, made to fit its 32 GB), its MFU against a floor, and its
accumulation overhead."""
from __future__ import annotations

import time

import numpy as np

from ..memory.devices import GB, get_device
from ..memory.peaks import device_peak, peak_flops
from ..memory.planner import estimate, parameter_total, strategy_from_recipe
from ..model.architecture import resolve_shape
from ..recipe.load import load_recipe
from .parts import MAX, MIN, REPO, Check, Context, Spec, train_step

# The MFU below which the 1B step is too slow: MindFormers' own llama-7B full fine-tune on the
# 910A, 1,229 tokens/s at 2K, is about 19% of its 256 TFLOPS; a 1B step at the shipped recipe
# should reach 15% there. The peaks are memory/peaks.py's: a SoC without one (the 910B, which
# stands for two chips whose peaks differ by source; the 910B4) has no floor, only tokens/s.
MFU_FLOOR = {"910a": 0.15}


# The 910B4 has 32 GB, not the 910B's 64: the 910B recipe (58 GB pool, 4 rows a micro-batch) does
# not fit it. Its speed step is that recipe at the 32 GB parts' 29 GB pool with one row, one
# micro-batch a step (no accumulators), which the planner fits (speed_plan; selftest --dry-run).
ON_910B4 = ("device.name=910b4", "device.max_device_memory=29GB", "train.micro_batch_size=1",
            "train.global_batch_size=0")


def recipe_file(ctx: Context):
    return REPO / "recipes" / f"llama3_2_1b_zh_full_{'910a' if ctx.soc == '910a' else '910b'}.yaml"


def speed_setting(ctx: Context) -> tuple:
    """(recipe file, its --set overrides) the speed checks time on this SoC."""
    return recipe_file(ctx), (ON_910B4 if ctx.soc == "910b4" else ())


def speed_recipe(ctx: Context):
    path, overrides = speed_setting(ctx)
    return load_recipe(path, list(overrides))


def speed_plan(recipe) -> str:
    """The planner's peak for the speed step against its device's pool; a ValueError (a build
    error of the check in a dry run) when it does not fit: the step would run out of memory."""
    shape = resolve_shape(recipe.model)
    params = parameter_total(shape)
    device = get_device(recipe.device.name, recipe.device.max_device_memory)
    plan = estimate(shape, params, device, strategy_from_recipe(recipe, device.name))
    rows = f"{recipe.train.micro_batch_size} row(s) of {recipe.data.max_seq_len:,} tokens"
    if not plan.fits:
        raise ValueError(f"the speed step ({rows}) does not fit the {device.name} by the planner: "
                         f"{plan.total_bytes / GB:.2f} GiB planned, {device.usable_bytes / GB:.2f} GiB usable")
    return (f"{rows}; planned {plan.total_bytes / GB:.2f} GiB with the margin, of {device.usable_bytes / GB:.2f} GiB "
            f"usable on the {device.name}")


def setting_name(ctx: Context) -> str:
    path, overrides = speed_setting(ctx)
    return path.name + (f" with {', '.join(overrides)}" if overrides else "")


def describe(ctx: Context) -> str:
    """The speed step's recipe as the listing names it: file, overrides, rows, plan."""
    return f"{setting_name(ctx)} ({speed_plan(speed_recipe(ctx))})"


def _skip(ctx: Context, on_cpu: str = "") -> str:
    if not ctx.speed:
        return "pass --speed (builds the 1B model: a few minutes)"
    if ctx.target != "ascend":
        return "a 1B step at 2,048 tokens takes minutes on a CPU; run it on a card" + on_cpu
    return ""


def speed_spec(ctx: Context) -> Spec:
    floor = MFU_FLOOR.get(ctx.soc) if peak_flops(ctx.soc, "float16") else None
    compares = (f"MFU (6 x parameters x tokens/s over the {ctx.soc} fp16 peak) of a 1B step at "
                f"{describe(ctx)}; tokens/s printed too" if floor is not None else
                f"tokens/s of a 1B step at {describe(ctx)}; no MFU floor: {unknown_peak(ctx.soc)}")
    return Spec("speed_1b_mfu", "speed", compares, floor, MIN, files=(speed_setting(ctx),), skip=_skip(ctx))


def accumulation_spec(ctx: Context) -> Spec:
    return Spec("speed_accumulation_overhead", "speed",
                f"time of the micro-batch of {describe(ctx)} as accumulated micro-batches of 1 over its time "
                f"as one", 1.05, MAX, files=(speed_setting(ctx),),
                skip=_skip(ctx, " (on the CPU: benchmarks/grad_accum_overhead.py)") or _one_row(ctx))


def _one_row(ctx: Context) -> str:
    if speed_recipe(ctx).train.micro_batch_size > 1:
        return ""
    return "the speed step's micro-batches have 1 row: none to split, and a larger batch may not fit this card"


def speed_figures(ctx: Context) -> dict:
    """A 1B model at this SoC's speed_setting, built once a run and timed
    over 3 steps: one micro-batch of the recipe's rows a step, then (rows >= 2) the same rows
    as that many accumulated micro-batches of 1 through a second step on the same network
    and optimizer."""
    if ctx.speed_run is not None:
        return ctx.speed_run
    from ..strategies.network import build_network  # imported here: it loads MindSpore, after quiet_frameworks

    recipe = speed_recipe(ctx)
    net, cell = build_network(recipe, on_ascend=True)
    rows = recipe.train.micro_batch_size
    ids = np.random.default_rng(0).integers(0, 128000, (rows, recipe.data.max_seq_len + 1)).astype(np.int32)

    def seconds_a_step(step, micro_batches) -> float:
        step(micro_batches, lr=1e-5)  # compile
        begin = time.perf_counter()
        for _ in range(3):
            step(micro_batches, lr=1e-5)
        return (time.perf_counter() - begin) / 3

    one = train_step(recipe, net, cell)
    ctx.speed_run = {"recipe": setting_name(ctx), "rows": rows, "tokens": rows * recipe.data.max_seq_len,
                     "params": sum(p.size for p in net.trainable_params()), "one": seconds_a_step(one, [(ids, ids)])}
    if rows >= 2:
        accumulating = train_step(recipe, net, cell, k=rows, optimizer=one.optimizer)
        ctx.speed_run["accumulated"] = seconds_a_step(accumulating, [(ids[i:i + 1], ids[i:i + 1]) for i in range(rows)])
    return ctx.speed_run


def unknown_peak(soc: str) -> str:
    """Why `soc` has no fp16 peak (memory/peaks.py), or why it has no floor."""
    peak, why = device_peak(soc, "float16")
    return f"no known fp16 peak for the {soc} ({why})" if peak is None else f"no MFU floor set for the {soc}"


def check_speed(ctx: Context, fault=None) -> Check:
    """Tokens/s and MFU of a 1B step at this SoC's speed_setting; fails
    below MFU_FLOOR, a skip (tokens/s still given) where the SoC's peak is unknown."""
    planned = speed_spec(ctx)
    if planned.skip:
        return planned.skipped()
    run = speed_figures(ctx)
    tokens_per_s = run["tokens"] / run["one"]
    what = f"{tokens_per_s:,.0f} tokens/s ({run['recipe']}, recompute as the recipe)"
    peak = peak_flops(ctx.soc, "float16")
    if peak is None or planned.tolerance is None:
        return planned.skipped(f"{what}; no MFU: {unknown_peak(ctx.soc)}")
    mfu = 6 * run["params"] * tokens_per_s / peak
    check = planned.judged(mfu, "")
    check.reason = f"{what}, MFU {mfu:.1%} of {peak / 1e12:.0f} TFLOPS (floor {planned.tolerance:.0%})"
    return check


def check_speed_accumulation(ctx: Context, fault=None) -> Check:
    """The time of the recipe's micro-batch split into accumulated micro-batches of 1, against
    it as one micro-batch: the accumulation overhead at a real size, where the CPU backend's
    own cost of splitting (benchmarks/grad_accum_overhead.py) does not decide it. Fails above
    1.05."""
    planned = accumulation_spec(ctx)
    if planned.skip:
        return planned.skipped()
    run = speed_figures(ctx)
    ratio = run["accumulated"] / run["one"]
    return planned.judged(ratio, f"{run['rows']} micro-batches of 1 take {ratio:.3f} x one of {run['rows']} rows "
                                 f"({run['recipe']})")
