"""`llama-npu doctor` on this machine and on a broken one; the Dockerfile's instructions."""
import glob
import re

import pytest

from conftest import REPO, run_cli


@pytest.mark.quick
def test_doctor_reports_versions_and_which_recipes_run_here():
    proc = run_cli("doctor", env={"LC_ALL": "C.UTF-8"})
    assert proc.returncode == 0
    assert "mindspore 2.9.0, mindformers 1.9.0" in proc.stdout and "CPU backend    works" in proc.stdout
    assert re.search(r"cpu_smoke.yaml\s+runs here", proc.stdout)
    assert re.search(r"llama3_2_1b_zh_full_910a.yaml\s+needs Ascend 910a.*outside MindFormers 1.9's supported",
                     proc.stdout)
    assert "MindFormers 1.9 lists Atlas 800T A2, Atlas 800I A2 and Atlas 900 A3 SuperPoD" in proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("next           llama-npu selftest --json selftest.json")
    # what it checks on a 910A and a 910B, and both pages of the docs for a reader of either language
    assert "on a 910A/910B doctor checks: /dev/davinci* count, the CANN version MindSpore 2.9 accepts" in proc.stdout
    assert "  910A: 32 GB HBM a card" in proc.stdout and "  910B: 64 GB HBM" in proc.stdout
    assert "device files   0 /dev/davinciN" in proc.stdout or glob.glob("/dev/davinci[0-9]*")
    assert proc.stdout.splitlines()[-1].endswith("(docs/ascend.md; 中文: docs/ascend.zh-CN.md)")


def test_doctor_answers_in_chinese_and_checks_the_cann_version_mindspore_accepts(tmp_path):
    """LANG=zh_CN: the checks and the pointer in Chinese, to the Chinese page; a CANN whose
    compiler/version.info says 7.0 is not one MindSpore 2.9.0 accepts (its run_check's list)."""
    (tmp_path / "compiler").mkdir()
    (tmp_path / "compiler" / "version.info").write_text("Version=7.0.0.alpha003\n")
    (tmp_path / "no-recipes").mkdir()
    proc = run_cli("doctor", "--recipes", tmp_path / "no-recipes", env={
        "LC_ALL": "", "LC_MESSAGES": "", "LANG": "zh_CN.UTF-8", "ASCEND_HOME_PATH": str(tmp_path)})
    assert proc.returncode == 0
    assert f"CANN           7.0.0.alpha003（MindSpore 2.9.0 需要 8.2, 8.3, 8.5, 9.0 之一；读自 {tmp_path}" in proc.stdout
    assert "不匹配：请安装 MindSpore 2.9.0 支持的 CANN（见 docs/ascend.zh-CN.md 的“支持的版本”一节" in proc.stdout
    assert "## 支持的版本" in (REPO / "docs" / "ascend.zh-CN.md").read_text()  # the section it names
    assert "在 910A/910B 上 doctor 检查" in proc.stdout
    assert proc.stdout.splitlines()[-1].endswith("（docs/ascend.zh-CN.md）")


def test_doctor_fails_when_mindspore_cannot_compute(tmp_path):
    # numpy 2 breaks MindSpore's tensor ops (FACTS.md); a numpy that fails to import breaks them too.
    fake = tmp_path / "numpy"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('numpy.core.multiarray failed to import')\n")
    proc = run_cli("doctor", env={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 1
    assert "CPU backend    BROKEN" in proc.stdout and "this environment cannot train" in proc.stderr


def dockerfile_instructions():
    text = (REPO / "docker" / "Dockerfile").read_text().replace("\\\n", " ")
    return [line.split(None, 1) for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_dockerfile_builds_on_a_cann_image_chosen_by_build_argument():
    instructions = dockerfile_instructions()
    known = {"ARG", "FROM", "WORKDIR", "COPY", "RUN", "ENV", "ENTRYPOINT", "CMD"}
    assert all(word in known for word, _ in instructions)
    assert instructions[0][0] == "ARG" and instructions[0][1].startswith("CANN_IMAGE=quay.io/ascend/cann:")
    assert ("FROM", "${CANN_IMAGE}") in [(w, a.strip()) for w, a in instructions]
    run = " ".join(a for w, a in instructions if w == "RUN")
    # the pinned pyproject with the offload extra (numba, no torch), its kernel imported and run at build time
    assert 'pip install --no-cache-dir ".[offload]"' in run and "kernel_problem()" in run and "torch" not in run
    assert [a.strip() for w, a in instructions if w == "ENTRYPOINT"] == ['["llama-npu"]']
    for word, arg in instructions:
        if word == "COPY":
            source = arg.split()[0]
            assert (REPO / source).exists(), f"COPY {source}: not in the repository"
