"""`llama-npu selftest`: set up the device, run every check (selftest/checks.py,
selftest/sharded.py), print a line each and write the JSON."""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Callable, List, Optional

from ..common.frameworks import mute_mindformers_info, quiet_frameworks
from ..common.launcher import launched_rank, launched_workers
from ..memory.devices import DEVICES
from . import checks, forward_saturation, host_optimizer, int8, registers, sharded, speed
from .checks import (check_data_parallel, check_export_exact, check_mask_flash_vs_plain, check_mask_packed,
                     check_mask_packed_sharded_loss, check_memory_vs_plan, check_overflow_skips_update,
                     check_precision_bf16, check_precision_fp16, check_resume_exact)
from .forward_saturation import check_forward_saturation
from .host_optimizer import check_host_optimizer
from .int8 import check_int8_matmul
from .jit import jit_level_and_backend
from .parts import FAIL, PASS, SKIP, Check, Context
from .registers import check_saturation_registers
from .sharded import barrier, check_export_sharded, check_sharded_layouts
from .speed import check_speed, check_speed_accumulation

SINGLE: List[Callable] = [check_overflow_skips_update, check_saturation_registers, check_forward_saturation,
                          check_precision_fp16,
                          check_precision_bf16, check_mask_packed, check_mask_packed_sharded_loss,
                          check_mask_flash_vs_plain, check_memory_vs_plan, check_speed, check_speed_accumulation,
                          check_resume_exact,
                          check_export_exact, check_export_sharded, check_data_parallel, check_sharded_layouts,
                          check_int8_matmul, check_host_optimizer]

MULTI: List[Callable] = [check_data_parallel, check_sharded_layouts, check_export_sharded]

# Each check -> its Spec for a context: what it compares, its tolerance and bound, the
# recipes it builds (selftest --dry-run builds and validates them without running anything).
SPECS = {check_overflow_skips_update: checks.overflow_spec, check_saturation_registers: registers.spec,
         check_forward_saturation: forward_saturation.spec,
         check_precision_fp16: lambda ctx: checks.precision_spec(ctx, "float16"),
         check_precision_bf16: lambda ctx: checks.precision_spec(ctx, "bfloat16"),
         check_mask_packed: checks.mask_spec, check_mask_packed_sharded_loss: checks.sharded_loss_spec,
         check_mask_flash_vs_plain: checks.flash_spec, check_memory_vs_plan: checks.memory_spec,
         check_speed: speed.speed_spec, check_speed_accumulation: speed.accumulation_spec,
         check_resume_exact: checks.resume_spec, check_export_exact: checks.export_spec,
         check_export_sharded: sharded.export_sharded_spec, check_data_parallel: checks.data_parallel_spec,
         check_sharded_layouts: sharded.layouts_spec, check_int8_matmul: int8.int8_spec,
         check_host_optimizer: host_optimizer.spec}


class SelftestError(ValueError):
    """Bad input to selftest (exit 2)."""


def has_npu() -> bool:
    return Path("/dev/davinci_manager").exists() or bool(shutil.which("npu-smi") and os.environ.get("ASCEND_HOME_PATH"))


def cann_version() -> str:
    home = os.environ.get("ASCEND_HOME_PATH") or os.environ.get("ASCEND_TOOLKIT_HOME")
    for candidate in ([Path(home) / "version.cfg", Path(home) / "compiler" / "version.info"] if home else []):
        if candidate.is_file():
            return candidate.read_text(errors="replace").strip().splitlines()[0]
    return "not found"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def set_up(device: str, speed: bool) -> Context:
    import mindspore as ms  # imported here: MindSpore loads after run_selftest's quiet_frameworks

    if device == "ascend" and not has_npu():
        raise SelftestError("selftest --device ascend: no Ascend NPU on this host (no /dev/davinci_manager, "
                            "npu-smi or CANN environment); use --device cpu")
    target = "ascend" if device == "ascend" or (device == "auto" and has_npu()) else "cpu"
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("Ascend" if target == "ascend" else "CPU")
    soc = "cpu"
    if target == "ascend":
        # imported here: MindSpore loads after run_selftest's quiet_frameworks
        from mindspore._c_expression import MSContext

        # mindspore/nn/wrap/loss_scale.py reads the SoC the same way.
        version = MSContext.get_instance().get_ascend_soc_version()
        soc = "910a" if version == "ascend910" else "910b" if version.startswith("ascend910b") else version
    workers = launched_workers()
    if workers > 1:
        from mindspore.communication import init  # imported here: MindSpore loads after run_selftest's quiet_frameworks

        init()
    ctx = Context(target, soc, workers, speed, rank=launched_rank())

    profile = DEVICES.get(soc)
    ctx.device = {"target": target, "soc": soc, "cann": cann_version() if target == "ascend" else "not used",
                  "mindspore": _version("mindspore"), "mindformers": _version("mindformers"),
                  "hbm_bytes": profile.hbm_bytes if profile and target == "ascend" else None,
                  "flash_attention": ctx.flash_attention, "bf16": ctx.bf16, "workers": workers,
                  # The global config and the SoC's default; overflow_skips_update adds the train
                  # step cell's own config (selftest/jit.py).
                  **jit_level_and_backend(target, soc, global_config=ms.context.get_jit_config())}
    return ctx


def run_selftest(device: str = "auto", json_path: Optional[str] = None, speed: bool = False,
                 emit: Callable[[str], None] = print) -> int:
    """Run every check, print a line each, write the JSON; 0 only if nothing failed."""

    if device not in ("auto", "cpu", "ascend"):
        raise SelftestError(f"selftest --device: expected auto, cpu or ascend, got {device!r}")
    quiet_frameworks(Path(tempfile.gettempdir()) / "llama-npu-logs" / "selftest")
    mute_mindformers_info()
    ctx = set_up(device, speed)
    main = ctx.rank == 0
    checks = []
    for fn in (MULTI if ctx.workers > 1 else SINGLE):
        try:
            # The code a check drives prints its own progress lines ("writing ...model.safetensors"):
            # kept out of the table, which is the checks' lines only.
            with contextlib.redirect_stdout(io.StringIO()):
                check = fn(ctx)
        except Exception as exc:  # a crash is a failure of that check, not of the selftest
            check = Check(fn.__name__.removeprefix("check_"), "error", FAIL, reason=f"{type(exc).__name__}: {exc}"[:300])
        checks.append(check)
        if main:
            emit(check.line())
    if ctx.work is not None:  # every rank is done with it before rank 0 removes it
        barrier()
        if main:
            shutil.rmtree(ctx.work, ignore_errors=True)
    failed = sum(c.status == FAIL for c in checks)
    if main:
        counts = {s: sum(c.status == s for c in checks) for s in (PASS, FAIL, SKIP)}
        emit(f"selftest on {ctx.soc}: {counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped")
        if json_path:
            Path(json_path).write_text(json.dumps({"device": ctx.device, "checks": [asdict(c) for c in checks]},
                                                  indent=2), encoding="utf-8")
    return 1 if failed else 0
