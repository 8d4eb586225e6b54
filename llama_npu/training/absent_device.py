"""`validate` on a host without the recipe's device, such as a cluster's login node where
recipes are prepared: every other check runs, at the layout the recipe will be launched
with, and the device check -- and with it the host-memory check of the optimizer on the host
-- is left for a host that has the device (unless --strict-device).
`train` still refuses to start there (preflight.check_device)."""
from __future__ import annotations

from typing import Optional

from ..memory.planner import host_bytes
from .preflight import check_device
from .request import request_problems


def layout_workers(recipe) -> int:
    par = recipe.strategies.parallel
    return par.data * par.model * par.pipeline


def validate_problems(args) -> tuple[list, Optional[object], object, Optional[dict], str]:
    """(problems, recipe, run dir, rehearsal report, the line saying the device check was left
    for another host, or "") of a `validate` command line."""
    problems, recipe, run_dir, rehearsal = request_problems(args)
    device = check_device(recipe) if recipe is not None else []
    if not device:
        return problems, recipe, run_dir, rehearsal, ""
    if args.workers is None and layout_workers(recipe) > 1:
        args.workers = layout_workers(recipe)  # as scripts/launch.sh RECIPE N will launch it
        problems, recipe, run_dir, rehearsal = request_problems(args)
    if args.strict_device:
        return problems, recipe, run_dir, rehearsal, ""
    left = (f"device check left for a host with the device: this host has no Ascend NPU (no /dev/davinci*) for "
            f"device.name={recipe.device.name}; everything else was checked for {args.workers or 1} worker(s) "
            f"(--strict-device makes the missing device an error)")
    rank_bytes = host_bytes(recipe)
    if rank_bytes:
        left += (f"; so are the host-memory check of strategies.offload.optimizer=host ({rank_bytes / 2**30:.2f} GiB "
                 f"a rank against that host's MemAvailable) and the check of its AdamW kernel (numba importable, "
                 f"at the offload extra's release, one update right)")
    return [p for p in problems if p not in device], recipe, run_dir, rehearsal, left
