"""What a user's host installs, asked of the package index the way pip asks it for that host
(issue 55): for each Python pyproject.toml declares and each architecture, every pin of the
base package and of each extra has a wheel that Python and platform accept and a
Requires-Python that admits it; and the offload extra's whole dependency closure resolves with
no CUDA package. Also: scripts/setup_env.sh installs the extras it is asked for, and its stamp
notices a change of them.

The host is taken to be a glibc 2.28 Linux (openEuler 20.03 and EulerOS on Atlas servers; the
CANN images' Ubuntu 22.04 accepts more): pip takes only the platform tags it is given, so every
manylinux tag such a host accepts is passed. The base package's closure is not resolved here:
its transitive jieba is published only as source, which `--only-binary=:all:` (needed with
--platform) refuses. pip runs with no configuration file, so this machine's local wheels (a
CPU torch) and mirror do not stand in for the index. Without a network the test skips, saying so.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from conftest import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
ARCHITECTURES = ("x86_64", "aarch64")
HOST_GLIBC_MINOR = 28
CUDA_PREFIXES = ("nvidia-", "cuda-", "triton")
NO_NETWORK = re.compile(r"NewConnectionError|Failed to establish a new connection|Temporary failure in name "
                        r"resolution|Network is unreachable|Name or service not known|ConnectTimeout|"
                        r"Could not fetch URL|ProxyError")


def declared_pythons() -> list:
    """The X.Y versions from 3.8 to 3.14 that requires-python admits."""
    admits = SpecifierSet(PROJECT["requires-python"])
    return [f"3.{minor}" for minor in range(8, 15) if admits.contains(f"3.{minor}.0")]


def platforms(arch: str) -> list:
    """Every manylinux tag a glibc 2.28 host of `arch` accepts, as pip's --platform takes them."""
    oldest = 17 if arch == "aarch64" else 5
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(HOST_GLIBC_MINOR, oldest - 1, -1)]
    legacy = {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}
    return tags + [f"{name}_{arch}" for name, minor in legacy.items() if minor >= oldest]


def pins(python: str, arch: str) -> dict:
    """{name: requirement} of the base package and every extra, markers evaluated for the host
    (an extra naming the project itself, as the test extra names the offload one, adds nothing
    of its own)."""
    groups = {"": PROJECT["dependencies"], **PROJECT["optional-dependencies"]}
    found = {}
    for extra, requirements in groups.items():
        for text in requirements:
            req = Requirement(text)
            host = {"python_version": python, "platform_machine": arch, "sys_platform": "linux", "extra": extra}
            if req.name != PROJECT["name"] and (req.marker is None or req.marker.evaluate(host)):
                found[req.name.lower()] = req
    return found


def pip_dry_run(python: str, arch: str, requirements: list, work, deps: bool) -> subprocess.Popen:
    """pip's own resolution for that host, from the package index only, its JSON report in `work`."""
    cache = os.path.join(tempfile.gettempdir(), "llama-npu-install-check-cache")  # kept across runs
    args = [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--ignore-installed",
            "--only-binary=:all:", "--python-version", python, *[f"--platform={p}" for p in platforms(arch)],
            "--target", str(work / "target"), "--report", str(work / "report.json"), "--cache-dir", cache,
            "--retries", "1", "--timeout", "30", "--disable-pip-version-check", *([] if deps else ["--no-deps"]),
            *requirements]
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


@pytest.fixture(scope="module")
def resolved(tmp_path_factory) -> dict:
    """{(what, python, arch): (exit code, pip's output, its report or None)}, what being "pins"
    (every pin alone, --no-deps) or "offload" (the offload extra's closure with the base's
    numpy pin). The dry runs go concurrently: each takes 5-45 s, mostly the index's answers."""
    runs = {}
    for python in declared_pythons():
        for arch in ARCHITECTURES:
            found = pins(python, arch)
            offload = [str(Requirement(r)) for r in PROJECT["optional-dependencies"]["offload"]] + [str(found["numpy"])]
            for what, requirements, deps in (("pins", [str(r) for r in found.values()], False),
                                             ("offload", offload, True)):
                work = tmp_path_factory.mktemp(f"{what}-{python}-{arch}")
                runs[what, python, arch] = (work, pip_dry_run(python, arch, requirements, work, deps))
    results = {}
    for key, (work, proc) in runs.items():
        output, _ = proc.communicate(timeout=600)
        report = work / "report.json"
        results[key] = (proc.returncode, output, json.loads(report.read_text()) if report.exists() else None)
    offline = [output for code, output, _ in results.values() if code and NO_NETWORK.search(output)]
    if offline:
        pytest.skip(f"the package index cannot be reached from here: {NO_NETWORK.search(offline[0]).group(0)}")
    return results


def installed(report: dict) -> dict:
    return {item["metadata"]["name"].lower(): item for item in report["install"]}


def test_the_declared_pythons_are_the_ones_setup_env_and_the_docs_name():
    pythons = declared_pythons()
    assert pythons, PROJECT["requires-python"]
    setup = (REPO / "scripts" / "setup_env.sh").read_text()
    assert re.search(r"^\s+" + re.escape("|".join(pythons)) + r"\) ;;$", setup, re.M), "setup_env.sh's case"
    said = pythons[0] if len(pythons) == 1 else f"{pythons[0]}–{pythons[-1]}"
    for doc in ("README.md", "README.zh-CN.md", "docker/README.md", "docker/README.zh-CN.md"):
        assert f"Python {said}" in (REPO / doc).read_text(), doc
    default = re.search(r"^ARG CANN_IMAGE=.*-py(3\.\d+)$", (REPO / "docker" / "Dockerfile").read_text(), re.M)
    assert default and default.group(1) in pythons


@pytest.mark.parametrize("python", declared_pythons())
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_pin_has_a_wheel_this_python_and_platform_accept(resolved, python, arch):
    """pip --no-deps picks each pin's wheel by its tags against this Python and every manylinux
    tag of the host, and refuses one whose Requires-Python does not admit the Python (from the
    wheel's metadata): every pin is then in the report, at its pinned version."""
    code, output, report = resolved["pins", python, arch]
    assert code == 0, output[-3000:]
    chosen = installed(report)
    for name, req in pins(python, arch).items():
        item = chosen.get(name) or chosen.get(name.replace("-", "_")) or chosen.get(name.replace(".", "-"))
        assert item is not None, f"{req}: not in pip's report for Python {python} on {arch}"
        assert req.specifier.contains(item["metadata"]["version"]), (req, item["metadata"]["version"])
        wheel = item["download_info"]["url"].rsplit("/", 1)[-1]
        assert wheel.endswith(".whl"), wheel
        requires = item["metadata"].get("requires_python")
        assert requires is None or SpecifierSet(requires).contains(f"{python}.0"), (wheel, requires)


@pytest.mark.parametrize("python", declared_pythons())
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_offload_extra_resolves_with_no_cuda_package(resolved, python, arch):
    """The host optimizer's kernel and everything it pulls, from the index, for that host: wheels
    only, and no nvidia-*, cuda-* or triton (torch from the index would bring them)."""
    code, output, report = resolved["offload", python, arch]
    assert code == 0, output[-3000:]
    names = sorted(installed(report))
    assert "numba" in names and "llvmlite" in names, names
    assert not [n for n in names if n.startswith(CUDA_PREFIXES)], names


def test_the_kernel_check_holds_the_numba_release_the_offload_extra_pins():
    from llama_npu.steps.host.kernel_check import NUMBA_VERSION

    numba = [Requirement(r) for r in PROJECT["optional-dependencies"]["offload"] if Requirement(r).name == "numba"]
    assert [str(r.specifier) for r in numba] == [f"=={NUMBA_VERSION}"]


def test_setup_env_installs_the_extras_asked_and_its_stamp_notices_a_change_of_them(tmp_path):
    """setup_env.sh in a copy of the checkout whose .venv's python only logs its arguments: the
    base package alone, then the test extra (installed, though pyproject.toml did not change),
    then nothing new for the base again; an unknown extra is refused with exit 2."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "setup_env.sh", tmp_path / "scripts")
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "log"}\n')
    python.chmod(0o755)

    def setup(*extras):
        (tmp_path / "log").write_text("")
        proc = subprocess.run(["bash", str(tmp_path / "scripts" / "setup_env.sh"), *extras], capture_output=True,
                              text=True)
        installs = [line.split(" -e ")[1] for line in (tmp_path / "log").read_text().splitlines() if " -e " in line]
        return proc.returncode, installs, proc.stderr

    assert setup()[:2] == (0, [str(tmp_path)])
    assert setup("test")[:2] == (0, [f"{tmp_path}[test]"])
    assert setup()[:2] == (0, [])
    assert setup("offload")[:2] == (0, [f"{tmp_path}[offload,test]"])
    code, installs, said = setup("cuda")
    assert (code, installs) == (2, []) and "unknown extra 'cuda'" in said
