"""Real tiny training runs through the CLI: outputs, checkpoints, resume."""
import json
import signal

import numpy as np
import pytest

from conftest import SIX_STEPS, SMOKE, TINY_RUN, assert_same_steps, read_metrics, run_cli, start_training, wait_until

REQUIRED = {"step", "loss", "lr", "grad_norm", "tokens_per_s", "peak_memory_bytes", "memory_source",
            "planned_peak_bytes"}


@pytest.mark.quick
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


def test_checkpoints_load_with_mindspore_and_hold_the_sidecar(six_step_run, ms):
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
    victim = start_training(out, *SIX_STEPS, log_dir=tmp_path / "logs")
    sidecar = out / "checkpoints" / "step_3" / "state.json"
    wait_until(sidecar.exists, victim, "the step-3 checkpoint")
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert sidecar.exists() and not (out / "checkpoints" / "step_6").exists()

    proc = run_cli("train", SMOKE, "--output-dir", out, "--resume", "auto", *SIX_STEPS, check=True)
    assert "resumed from" in proc.stdout and "step 3" in proc.stdout
    assert_same_steps(out, straight, (4, 5, 6))

# Each strategy setting in at least one combination, each combination a distinct code path
# (precision level and scaling, LoRA or full fine-tune, optimizer): a setting that was a
# combination of its own is part of a larger one here, and is checked alone, in process, in
# tests/test_strategies.py. The whole product of the strategies is `llama-npu profile`'s
# default matrix (docs/profiling-and-benchmarks.md).
COMBOS = {
    "fp16-O2-dynamic-scale-accum2-recompute-full": ["strategies.precision.amp_level=O2",
                                                    "strategies.precision.loss_scale=dynamic",
                                                    "train.global_batch_size=4", "strategies.recompute.mode=full"],
    "lora-fp16-accum2": ["strategies.lora.enabled=true", "strategies.precision.amp_level=O1",
                         "strategies.precision.loss_scale=static:1024", "train.global_batch_size=4"],
    "fp16-O3-sgd-chunked-accum2": ["strategies.precision.amp_level=O3", "train.optimizer.name=sgd", "strategies.precision.loss_scale=dynamic",
                               "strategies.chunked_ce.enabled=true", "strategies.chunked_ce.chunk_size=16",
                               "train.global_batch_size=4"],
    "all-fp32": ["train.global_batch_size=4", "strategies.recompute.mode=full", "strategies.recompute.layers=1",
                 "strategies.chunked_ce.enabled=true", "strategies.chunked_ce.chunk_size=24",
                 "strategies.lora.enabled=true", "strategies.lora.target_modules=.*w1|.*w2|.*w3"],
    "all-fp16": ["strategies.precision.amp_level=O2", "strategies.precision.loss_scale=dynamic",
                 "train.global_batch_size=4", "strategies.recompute.mode=selective",
                 "strategies.chunked_ce.enabled=true", "strategies.chunked_ce.chunk_size=16",
                 "strategies.lora.enabled=true"],
}


@pytest.mark.parametrize("name", sorted(COMBOS))
def test_strategy_combination_trains_three_steps(tmp_path, name):
    out = tmp_path / name
    overrides = [arg for o in COMBOS[name] for arg in ("--set", o)]
    # keep_prompt: the 32-token rows these combinations were chosen on, as before data.truncation; over 3
    # steps of other batches the loss falls on them, where under keep_end all-fp16's third step ended above its first
    run_cli("train", SMOKE, "--output-dir", out, *TINY_RUN, *overrides, "--set", "train.max_steps=3",
            "--set", "train.warmup_steps=0", "--set", "train.optimizer.lr=1e-2", "--set", "data.truncation=keep_prompt",
            check=True)
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(np.isfinite(r["loss"]) for r in rows)
    assert not rows[-1]["overflow"]
    assert rows[-1]["loss"] < rows[0]["loss"]
    # a recipe that scales the loss also draws the scale (and the steps it skipped)
    scaled = any(o.startswith("strategies.precision.loss_scale=") for o in COMBOS[name])
    assert (out / "images" / "loss_scale.png").is_file() == scaled


def test_the_smoke_recipe_fits_a_small_ci_runner(tmp_path):
    """The smoke run's host peak is set by the graphs its first step and its evaluation
    compile, so two steps of it reach the peak of all 80: under 4 GiB, where a hosted CI
    runner has 7 GB (2.22 GiB measured over the whole run)."""
    out = tmp_path / "smoke"
    run_cli("train", SMOKE, "--output-dir", out, "--set", "train.max_steps=2", check=True)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["memory_source"] == "host_rss" and summary["eval_tokens"] > 0
    last = read_metrics(out)[-1]  # the end-of-run held-out loss is the last step's record's too
    assert (last["step"], last["eval_loss"], last["eval_tokens"]) == (2, summary["eval_loss"], summary["eval_tokens"])
    assert summary["peak_memory_bytes"] < 4 * 2**30, f"{summary['peak_memory_bytes'] / 2**30:.2f} GiB"


def test_epochs_count_the_steps_and_a_longer_resume_keeps_the_schedule_at_its_floor(tmp_path):
    import math
    import re

    import yaml
    out = tmp_path / "run"
    by_epochs = [*TINY_RUN, "--set", "train.save_every=2", "--set", "train.max_steps=null"]
    proc = run_cli("train", SMOKE, "--output-dir", out, *by_epochs, "--set", "train.epochs=0.05", check=True)
    said = re.search(r"train\.epochs: 0\.05 epochs = (\d+) steps of 2 x 32 tokens \((\d+) training rows, (\d+) steps an "
                     r"epoch\)", proc.stdout)
    assert "first training example: " in proc.stdout  # every run prints it at its start (data/example.py)
    steps, rows, per_epoch = map(int, said.groups())  # 2 rows a step (TINY_RUN), as the Hugging Face Trainer counts
    assert (per_epoch, steps) == (rows // 2, math.ceil(0.05 * (rows // 2)))
    assert [r["step"] for r in read_metrics(out)] == list(range(1, steps + 1))
    stored = yaml.safe_load((out / "recipe.yaml").read_text())["train"]
    assert (stored["max_steps"], stored["epochs"]) == (None, 0.05)  # which the user gave: a resume is not refused
    # more epochs on resume, from the run's own recipe.yaml: the schedule keeps its length, then its floor
    proc = run_cli("train", "--output-dir", out, "--resume", "auto", "--set", "train.epochs=0.1", check=True)
    more = math.ceil(0.1 * (rows // 2))
    assert f"training for {more - steps} of {more} steps left," in proc.stdout
    assert (f"the learning-rate schedule keeps the {steps} steps the run started with and continues at its floor, "
            f"0.0003, from step {steps} to {more}; --set train.reschedule=true stretches it to {more} steps "
            f"instead") in proc.stdout
    lrs = [r["lr"] for r in read_metrics(out)]
    assert lrs[steps - 1:] == pytest.approx([3e-4] * (more - steps + 1), rel=1e-6)


def test_reschedule_stretches_the_schedule_of_a_resumed_run(six_step_run, tmp_path):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(six_step_run[0], out)
    proc = run_cli("train", SMOKE, "--output-dir", out, "--resume", "auto", *SIX_STEPS, "--set", "train.max_steps=8",
                   "--set", "train.reschedule=true", check=True)
    assert ("train.reschedule=true: the learning-rate schedule is stretched from the 6 steps the run started with "
            "to 8") in proc.stdout
    assert "training for 2 of 8 steps left," in proc.stdout
    lrs = {r["step"]: r["lr"] for r in read_metrics(out)}
    # warm-up 2, then cosine over 6 steps from 3e-3 to 3e-4: step 7's lr is on the stretched curve, above the floor
    import math
    assert lrs[7] == pytest.approx(3e-4 + 2.7e-3 * 0.5 * (1 + math.cos(math.pi * 5 / 6)), rel=1e-6)
