"""Real tiny training runs through the CLI: outputs, checkpoints, resume."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import REPO, SMOKE, TINY_RUN, read_metrics, run_cli

REQUIRED = {"step", "loss", "lr", "grad_norm", "tokens_per_s", "peak_memory_bytes", "memory_source"}


def test_run_writes_metrics_tensorboard_recipe_and_summary(six_step_run):
    out, proc = six_step_run
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    for row in rows:
        assert REQUIRED <= row.keys()
        assert np.isfinite(row["loss"]) and row["memory_source"] == "host_rss"
        assert row["peak_memory_bytes"] > 0
    # warm-up: lr rises linearly for 2 steps, then decays
    assert rows[0]["lr"] < rows[1]["lr"] and rows[5]["lr"] < rows[1]["lr"]
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    saved = (out / "recipe.yaml").read_text()
    assert "max_steps: 6" in saved and "max_seq_len: 32" in saved
    for line in ("steps          6", "loss ", "tokens/s", "peak memory", "host peak RSS", "checkpoint"):
        assert line in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["checkpoint"].endswith("step_6")


def test_checkpoints_load_with_mindspore_and_hold_the_sidecar(six_step_run):
    import mindspore as ms

    out, _ = six_step_run
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert ckpts == ["step_3", "step_6"]
    weights = ms.load_checkpoint(str(out / "checkpoints" / "step_6" / "model.ckpt"))
    assert weights["model.tok_embeddings.embedding_weight"].shape == (128256, 64)
    opt = ms.load_checkpoint(str(out / "checkpoints" / "step_6" / "optimizer.ckpt"))
    assert any(name.startswith("adam_m.") for name in opt)
    state = json.loads((out / "checkpoints" / "step_6" / "state.json").read_text())
    assert state["step"] == 6 and state["samples_consumed"] == 12
    assert {"rng", "loss_scale", "recipe_hash"} <= state.keys()


def test_existing_output_dir_is_not_overwritten(six_step_run):
    out, _ = six_step_run
    before = (out / "metrics.jsonl").read_text()
    proc = run_cli("train", SMOKE, "--output-dir", out, *TINY_RUN, "--set", "train.max_steps=6")
    assert proc.returncode == 2 and "is not empty" in proc.stderr
    assert (out / "metrics.jsonl").read_text() == before


def test_resume_path_without_complete_checkpoint_says_so(tmp_path):
    broken = tmp_path / "step_3"
    broken.mkdir()
    (broken / "model.ckpt").write_bytes(b"partial")
    proc = run_cli("train", SMOKE, "--output-dir", tmp_path / "run", "--resume", broken, *TINY_RUN)
    assert proc.returncode == 2 and "not a complete checkpoint" in proc.stderr


def test_hard_kill_then_resume_continues_exactly(six_step_run, tmp_path):
    straight, _ = six_step_run
    out = tmp_path / "killed"
    args = [sys.executable, "-m", "llama_npu", "train", str(SMOKE), "--output-dir", str(out), *TINY_RUN,
            "--set", "train.max_steps=6", "--set", "train.save_every=3", "--set", "train.keep_last=5"]
    victim = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sidecar = out / "checkpoints" / "step_3" / "state.json"
    deadline = time.monotonic() + 300
    while not sidecar.exists() and victim.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert sidecar.exists() and not (out / "checkpoints" / "step_6").exists()

    proc = run_cli("train", SMOKE, "--output-dir", out, "--resume", "auto", *TINY_RUN,
                   "--set", "train.max_steps=6", "--set", "train.save_every=3", "--set", "train.keep_last=5",
                   check=True)
    assert "resumed from" in proc.stdout and "step 3" in proc.stdout
    resumed = {r["step"]: r for r in read_metrics(out)}
    reference = {r["step"]: r for r in read_metrics(straight)}
    assert sorted(resumed) == [1, 2, 3, 4, 5, 6]
    for step in (4, 5, 6):
        assert resumed[step]["loss"] == pytest.approx(reference[step]["loss"], abs=1e-6)
        assert resumed[step]["lr"] == pytest.approx(reference[step]["lr"], rel=1e-12)
        assert resumed[step]["samples_consumed"] == reference[step]["samples_consumed"]
