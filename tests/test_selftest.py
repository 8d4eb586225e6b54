"""llama-npu selftest on the CPU: the command CI runs, and each CPU check broken on purpose."""
import json

import pytest

from conftest import run_cli


@pytest.fixture(scope="session")
def cpu_selftest(tmp_path_factory):
    out = tmp_path_factory.mktemp("selftest") / "selftest.json"
    proc = run_cli("selftest", "--device", "cpu", "--json", out, timeout=900)
    return proc, json.loads(out.read_text()) if out.exists() else None


def test_cpu_selftest_passes_its_checks_and_gives_every_skip_a_reason(cpu_selftest):
    proc, report = cpu_selftest
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = report["checks"]
    passed = [c["name"] for c in checks if c["status"] == "pass"]
    assert len(passed) >= 6 and not [c for c in checks if c["status"] == "fail"]
    assert all(c["reason"] for c in checks if c["status"] == "skip")
    assert {c["category"] for c in checks} == {"overflow", "precision", "mask", "memory", "speed", "parallel", "export"}
    # A check the CPU cannot run is a skip, never a pass.
    status = {c["name"]: c["status"] for c in checks}
    assert status["precision_bf16_vs_fp32"] == status["mask_flash_vs_plain"] == status["memory_vs_plan"] == "skip"
    # The sharded export runs what a host can (shards saved, merged, exported, compared) and
    # still skips: the shards of a compiled sharded graph need a card.
    export = next(c for c in checks if c["name"] == "export_merge_sharded")
    assert (export["status"], export["figure"]) == ("skip", 0.0) and "bit-exactly" in export["reason"]
    assert set(report["device"]) >= {"soc", "cann", "mindspore", "mindformers", "hbm_bytes", "overflow_mode"}
    assert report["device"]["overflow_mode"] == "is-finite reduction"
    lines = proc.stdout.splitlines()
    assert len(lines) == len(checks) + 1  # the table is the checks' lines and the summary, nothing else
    for c, line in zip(checks, lines):  # one printed line a check: name, status, figure against tolerance or reason
        assert line.startswith(c["name"]) and c["status"] in line
    assert "6 passed, 0 failed" in proc.stdout.splitlines()[-1]


def test_selftest_on_ascend_without_an_npu_is_one_line_and_exit_2():
    proc = run_cli("selftest", "--device", "ascend")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "no Ascend NPU on this host" in proc.stderr


@pytest.mark.parametrize("name", ["overflow_skips_update", "precision_fp16", "mask_packed",
                                  "mask_packed_sharded_loss", "resume_exact", "export_exact", "export_sharded"])
def test_each_cpu_check_fails_when_its_subject_is_broken(ms, name):
    """The fault of each check (a scale that cannot overflow, a half run at 10^5 x the rate,
    packed rows without their mask, a resume without the optimizer state, a float16
    export, a rank saving another rank's shards) makes it fail: none of them passes
    whatever happens."""
    from llama_npu.selftest import run as selftest

    check = getattr(selftest, f"check_{name}")(selftest.Context("cpu", "cpu"), fault=True)
    assert check.status == "fail" and check.reason
    assert check.figure > check.tolerance


def test_launch_selftest_runs_the_multi_card_checks_on_two_workers(tmp_path):
    """scripts/launch.sh --selftest 2: two msrun workers step a data-parallel model 3 times
    (once with one micro-batch a rank, twice with 2 accumulated); the ranks' weights hash the
    same and equal one process stepping the global batch. The
    sharded layouts are built through train.setup and the reference stepped; comparing them
    needs a card, so that check and the sharded export are skips saying what ran."""
    import os
    import random
    import subprocess

    from conftest import REPO

    out = tmp_path / "parallel.json"
    env = {**os.environ, "LOG_DIR": str(tmp_path / "logs"), "MASTER_PORT": str(random.randint(20000, 40000))}
    proc = subprocess.run(["bash", "scripts/launch.sh", "--selftest", "2", "--json", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check, sharded, export = json.loads(out.read_text())["checks"]
    assert (check["name"], check["status"]) == ("data_parallel_equals_one_process", "pass")
    assert check["figure"] <= check["tolerance"] and "data_parallel_equals_one_process" in proc.stdout
    assert (sharded["name"], sharded["status"], export["status"]) == ("sharded_model_pipeline_optimizer", "skip", "skip")
    assert "built model2 (data 1), pipeline2 (data 1), optimizer_shard (data 2) through train.setup" in sharded["reason"]
    losses = [float(v) for v in sharded["reason"].split("(losses ")[1].split(")")[0].split(", ")]
    assert losses[0] > losses[1] > losses[2]  # the reference learns the batch it sees again
    assert "needs Ascend" in sharded["reason"] and "sharded_model_pipeline_optimizer" in proc.stdout
