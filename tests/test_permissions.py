"""Outputs carry the user's umask, not MindSpore's owner-only modes (checkpoints 0400,
MindRecord 0600), so others on a shared host can read a run."""
import os
import stat

from conftest import REPO, run_cli
from llama_npu.atomic import current_umask


def modes(root):
    return {p.relative_to(root).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}


def test_checkpoints_follow_the_umask(six_step_run):
    run_dir, _ = six_step_run
    step = run_dir / "checkpoints" / "step_6"
    mask = current_umask()
    found = modes(step)
    assert found.pop(".") == 0o777 & ~mask
    assert found and set(found.values()) == {0o666 & ~mask}, found


def test_prepared_data_follows_a_group_readable_umask(tmp_path):
    out = tmp_path / "prepared"
    run_cli("prepare-data", "--format", "alpaca", "--input", REPO / "data" / "zh_instruct_eval.jsonl",
            "--output", out, "--max-seq-len", "64", preexec_fn=lambda: os.umask(0o027), check=True)
    found = modes(out)
    assert found.pop(".") == 0o750
    assert set(found.values()) == {0o640}, found
