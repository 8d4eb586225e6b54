"""Outputs carry the user's umask, not MindSpore's owner-only modes (checkpoints 0400,
MindRecord 0600), so others on a shared host can read a run; a file replaced in place is
the old one or the new one, never half of one (common/atomic.py)."""
import os
import stat

import pytest

from conftest import REPO, run_cli
from llama_npu.common.atomic import current_umask


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


def test_a_replacement_that_fails_keeps_the_old_file_and_leaves_no_hidden_copy(tmp_path):
    from llama_npu.common.atomic import replace_file

    path = tmp_path / "metrics.jsonl"
    path.write_text("old\n")

    def full_disk(tmp):
        tmp.write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        replace_file(path, full_disk)
    assert path.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
    replace_file(path, lambda tmp: tmp.write_text("new\n"))
    assert path.read_text() == "new\n" and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
