"""`llama-npu doctor`: what this machine can train, and why not when it cannot."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from ..recipe.load import load_recipe
from ..recipe.problems import RecipeError
from .ascend_host import TEXT, ascend_host_lines, reader_language

# From MindFormers 1.9.0's package description ("Version Mapping"): the hardware it supports.
MINDFORMERS_HARDWARE = "Atlas 800T A2, Atlas 800I A2 and Atlas 900 A3 SuperPoD (Atlas A2/A3)"
CANN_VARIABLES = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_OPP_PATH", "ASCEND_AICPU_PATH",
                  "ASCEND_RT_VISIBLE_DEVICES", "HCCL_BUFFSIZE")


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _npu_smi() -> str:
    if shutil.which("npu-smi") is None:
        return ""
    try:
        return subprocess.run(["npu-smi", "info"], capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"npu-smi failed: {exc}"


def _cpu_backend_works() -> str:
    """'' when a MindSpore tensor op runs on CPU, else the error (numpy 2 breaks it, FACTS.md)."""
    probe = ("import mindspore as ms; ms.set_device('CPU'); "
             "print(float((ms.Tensor([1.0, 2.0]) * 2).sum().asnumpy()))")
    env = {**os.environ, "GLOG_v": "3"}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    if proc.returncode == 0 and proc.stdout.strip().endswith("6.0"):
        return ""
    return (proc.stderr.strip().splitlines() or ["no output"])[-1]


def diagnose(recipes_dir: Path) -> tuple[list[str], int]:
    import psutil  # imported here: --help imports this module; psutil, only the doctor's report

    lines = []
    versions = {p: _version(p) for p in ("mindspore", "mindformers", "numpy", "llama-npu")}
    lines.append("versions       " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    cpu_error = _cpu_backend_works() if versions["mindspore"] != "not installed" else "mindspore is not installed"
    lines.append("CPU backend    " + ("works" if not cpu_error else f"BROKEN: {cpu_error}"))
    cann = {k: os.environ[k] for k in CANN_VARIABLES if k in os.environ}
    lines.append("CANN env       " + (", ".join(f"{k}={v}" for k, v in cann.items()) or "none set"))
    smi = _npu_smi()
    has_npu = bool(smi) and "Error" not in smi
    lines.append("Ascend NPUs    " + ("npu-smi info:\n" + smi if smi else "none (npu-smi not found)"))
    memory = psutil.virtual_memory()
    lines.append(f"host memory    {memory.available / 2**30:.1f} GiB free of {memory.total / 2**30:.1f} GiB")
    targets = ["CPU"] + (["Ascend"] if has_npu and cann else [])
    lines.append("device targets " + ", ".join(targets))
    lines.append(f"supported      MindFormers 1.9 lists {MINDFORMERS_HARDWARE} as its hardware; "
                 f"910A (Atlas training series) runs are outside that list: they train without flash "
                 f"attention and the fused RmsNorm")

    language = reader_language()
    lines += ascend_host_lines(language)
    lines.append("recipes")
    check_data = None
    if not cpu_error:  # the data check loads numpy, which is what a broken environment may lack
        from ..training.preflight import check_data
    for path in sorted(recipes_dir.glob("*.yaml")):
        try:
            recipe = load_recipe(path)
        except RecipeError as exc:
            lines.append(f"  {path.name:<40} invalid: {exc}")
            continue
        if recipe.device.target == "cpu":
            verdict = "runs here" if not cpu_error else "cannot run: the CPU backend is broken"
        elif has_npu and cann:
            verdict = f"needs {recipe.device.name}; NPUs present (check the model matches)"
        else:
            verdict = f"needs Ascend {recipe.device.name}: no NPU or CANN environment here"
        if recipe.device.name == "910a":
            verdict += " (910A: outside MindFormers 1.9's supported hardware)"
        # train's data check: a recipe that reads its data wrong runs nowhere
        problems = check_data(recipe) if check_data else []
        if problems:
            more = f" (and {len(problems) - 1} more: llama-npu validate lists them)" if len(problems) > 1 else ""
            verdict = f"cannot start: {problems[0]}{more}"
        lines.append(f"  {path.name:<40} {verdict}")
    lines.append(TEXT[language]["next"])
    return lines, (1 if cpu_error and not has_npu else 0)
