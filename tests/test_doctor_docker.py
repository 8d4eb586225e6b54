"""`llama-npu doctor` on this machine and on a broken one; the Dockerfile's instructions."""
import re

import pytest

from conftest import REPO, run_cli


@pytest.mark.quick
def test_doctor_reports_versions_and_which_recipes_run_here():
    proc = run_cli("doctor")
    assert proc.returncode == 0
    assert "mindspore 2.9.0, mindformers 1.9.0" in proc.stdout and "CPU backend    works" in proc.stdout
    assert re.search(r"cpu_smoke.yaml\s+runs here", proc.stdout)
    assert re.search(r"llama3_2_1b_zh_full_910a.yaml\s+needs Ascend 910a.*outside MindFormers 1.9's supported",
                     proc.stdout)
    assert "MindFormers 1.9 lists Atlas 800T A2, Atlas 800I A2 and Atlas 900 A3 SuperPoD" in proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("next           llama-npu selftest --json selftest.json")


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
    assert "pip install --no-cache-dir ." in run  # installs the pinned pyproject
    assert [a.strip() for w, a in instructions if w == "ENTRYPOINT"] == ['["llama-npu"]']
    for word, arg in instructions:
        if word == "COPY":
            source = arg.split()[0]
            assert (REPO / source).exists(), f"COPY {source}: not in the repository"
