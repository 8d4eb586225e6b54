"""`llama-npu selftest --dry-run --soc S`: every check's Spec for that SoC, with the recipes
it would build loaded and validated and their settings built (loss scaler, model shape,
planner strategy), without MindSpore and without running anything. It lists what each
check would compare and its tolerance, so a user sees what their card will be asked, and
a check whose recipe this SoC refuses is an error (exit 1)."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional

from ..memory.devices import DEVICE_TARGETS, get_device
from ..memory.planner import strategy_from_recipe
from ..model.architecture import resolve_shape
from ..recipe.load import load_recipe
from ..strategies.precision import LossScaler
from .jit import jit_level_and_backend
from .parts import MIN, SKIP, Check, Context
from .run import MULTI, SINGLE, SPECS, SelftestError

PLANNED, ERROR = "planned", "error"


def settings(recipe) -> None:
    """What a check derives from its recipe before building MindSpore cells: any of them
    raising is a build error of that check."""
    LossScaler(recipe.strategies.precision)
    resolve_shape(recipe.model)
    strategy_from_recipe(recipe, recipe.device.name)
    get_device(recipe.device.name)


def planned(check: Callable, ctx: Context) -> Check:
    """The check as it would run on `ctx`: planned (its recipes built), a skip, or an error."""
    name = check.__name__.removeprefix("check_")
    try:
        spec = SPECS[check](ctx)
        name = spec.name
        if not spec.skip:
            for overrides in spec.recipes:
                settings(ctx.recipe(*overrides))
            for path, overrides in spec.files:
                settings(load_recipe(path, list(overrides)))
    except Exception as exc:  # a check that cannot be built is reported, not a crash of the dry run
        return Check(name, "error", ERROR, reason=f"{type(exc).__name__}: {exc}"[:300])
    return Check(spec.name, spec.category, SKIP if spec.skip else PLANNED, None, spec.tolerance, spec.skip,
                 spec.bound, spec.compares)


def line(check: Check) -> str:
    tolerance = ("" if check.tolerance is None else
                 f"{'at least' if check.bound == MIN else 'at most'} {check.tolerance:.3g}")
    return f"{check.name:<34}{check.status:<8}{tolerance:<16}{check.reason or check.compares}"


def dry_run(soc: Optional[str], json_path: Optional[str] = None, emit: Callable[[str], None] = print) -> int:
    """Every check for `soc` (one of the device catalogue's names), built, not run: the
    single-device ones at 1 worker, the msrun ones at 2. 0 unless a check is in error."""
    if soc not in DEVICE_TARGETS:
        raise SelftestError(f"selftest --soc: expected one of {', '.join(DEVICE_TARGETS)}, got {soc!r}"
                            if soc else f"selftest --dry-run: needs --soc, one of {', '.join(DEVICE_TARGETS)}")
    target = DEVICE_TARGETS[soc]
    single, multi = Context(target, soc, speed=True), Context(target, soc, workers=2, speed=True)
    results = [planned(check, multi if check in MULTI else single) for check in SINGLE]
    for check in results:
        emit(line(check))
    errors = sum(c.status == ERROR for c in results)
    emit(f"selftest --dry-run on {soc}: {sum(c.status == PLANNED for c in results)} planned, "
         f"{sum(c.status == SKIP for c in results)} skipped, {errors} in error (nothing was run)")
    if json_path:
        device = {"target": target, "soc": soc, "dry_run": True, "flash_attention": single.flash_attention,
                  "bf16": single.bf16, **jit_level_and_backend(target, soc)}
        Path(json_path).write_text(json.dumps({"device": device, "checks": [asdict(c) for c in results]}, indent=2),
                                   encoding="utf-8")
    return 1 if errors else 0
