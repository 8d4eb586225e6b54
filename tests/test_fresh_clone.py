"""A fresh clone as a user runs it: scripts/setup_env.sh's console, and a suite that does not
depend on what the checkout holds beyond the shipped files (tests/conftest.py: shipped_view,
shipped_checkout)."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys

from conftest import REPO, run_cli, shipped_view



def test_a_clone_holding_a_finished_smoke_run_is_seen_as_shipped(tmp_path):
    """scripts/smoke.sh leaves runs/cpu_smoke in the clone; `validate recipes/cpu_smoke.yaml`
    there adds "output directory runs/cpu_smoke is not empty" to any line a test expects. The
    view the tests run in leaves it out, whether the clone is a git checkout or a copied tree."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--shared", REPO, clone], check=True)
    smoke_run = clone / "runs" / "cpu_smoke"
    (smoke_run / "checkpoints" / "step_00000020").mkdir(parents=True)
    (smoke_run / "metrics.jsonl").write_text('{"step": 20, "loss": 1.83}\n')
    (smoke_run / "recipe.yaml").write_text((REPO / "recipes" / "cpu_smoke.yaml").read_text())
    args = ["validate", "recipes/cpu_smoke.yaml", "--set", "device.max_device_memory=0GB"]

    in_clone = run_cli(*args, cwd=clone)
    assert in_clone.returncode == 2 and "output directory runs/cpu_smoke is not empty" in in_clone.stderr

    for kind in ("git checkout", "copied tree"):
        if kind == "copied tree":
            shutil.rmtree(clone / ".git")
        view = tmp_path / kind.replace(" ", "-")
        view.mkdir()
        shipped_view(clone, view)
        assert not (view / "runs").exists() and (view / "recipes").is_symlink(), kind
        proc = run_cli(*args, cwd=view)
        # the line test_recipe.py expects, alone
        assert proc.returncode == 2 and proc.stderr.strip().startswith(
            "llama-npu: error: device.max_device_memory: expected a size above zero"), kind
        assert "not empty" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, kind


def test_setup_filters_setuptools_editable_banner_and_nothing_else():
    """setup_env.sh's PYTHONWARNINGS drops the warning setuptools' editable build ends with
    (which pip prints as a BuildBackendWarning block), caught as pip's build-backend hook
    catches warnings (pyproject_hooks/_in_process: catch_warnings(record=True)); another
    setuptools warning still comes through."""
    script = (REPO / "scripts" / "setup_env.sh").read_text()
    value = re.search(r'PYTHONWARNINGS="([^"$]+)', script).group(1)
    probe = ("import warnings\n"
             "from setuptools.warnings import InformationOnly\n"
             "with warnings.catch_warnings(record=True) as caught:\n"
             "    InformationOnly.emit('Editable installation.', 'Please be careful with folders ...')\n"
             "    InformationOnly.emit('Another notice.', 'kept')\n"
             "print([str(w.message).splitlines()[0] for w in caught])")
    shown = {name: subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                                  env={"PATH": "/usr/bin:/bin", **env}).stdout.strip()
             for name, env in (("plain", {}), ("setup", {"PYTHONWARNINGS": value}))}
    assert shown == {"plain": "['Editable installation.', 'Another notice.']", "setup": "['Another notice.']"}
