"""Long runs that must not lose work: real signals, real non-finite steps, real disk errors
and damaged files, on the tiny model through the real command line."""
import glob
import json
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import yaml

from conftest import (REPO, SIX_STEPS, SMOKE, TINY_RUN, assert_same_steps, read_metrics, run_cli, run_launch,
                      start_training, wait_until)

PREEMPTED = 75


def metric_lines(out) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def copy_run(run, dst):
    shutil.copytree(run, dst)
    return dst


def test_sigint_saves_a_checkpoint_exits_75_and_the_printed_command_resumes_exactly(six_step_run, tmp_path):
    reference, _ = six_step_run
    out = tmp_path / "run"
    proc = start_training(out, *SIX_STEPS, log_dir=tmp_path / "logs")
    wait_until(lambda: metric_lines(out) >= 1, proc, "the first step")
    proc.send_signal(signal.SIGINT)  # Ctrl-C: MindSpore's own handler would report it as SIGTERM
    assert proc.wait(timeout=300) == PREEMPTED
    stopped = json.loads((out / "summary.json").read_text())["steps"]
    assert stopped < 6, "the run finished before the signal reached it"
    assert json.loads((out / "summary.json").read_text())["stopped_by"] == "SIGINT"
    assert "SIGINT received: finishing this step" in (tmp_path / "logs" / "stdout").read_text()
    last = (tmp_path / "logs" / "stderr").read_text().strip().splitlines()[-1]
    assert last.startswith(f"llama-npu: stopped by SIGINT after step {stopped}; ")
    assert json.loads((out / "checkpoints" / f"step_{stopped}" / "state.json").read_text())["step"] == stopped
    stored = (out / "recipe.yaml").read_text()

    # The printed command, as printed: no recipe, no --set; the run's own recipe.yaml.
    command = shlex.split(last.split("continue with: ", 1)[1])
    assert command == ["llama-npu", "train", "--resume", "auto", "--output-dir", str(out)]
    proc = run_cli(*command[1:], check=True)
    assert f"resumed from {out / 'checkpoints' / f'step_{stopped}'}" in proc.stdout
    assert_same_steps(out, reference, range(stopped + 1, 7))
    assert (out / "recipe.yaml").read_text() == stored
    # one history, drawn whole: the stop and the resume at its step, then the end
    history = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert [(e["event"], e["step"], e.get("reason")) for e in history] == [
        ("start", 0, None), ("stop", stopped, "SIGINT"), ("resume", stopped, None), ("end", 6, None)]
    assert (out / "images" / "loss.png").is_file()


def test_resume_with_a_recipe_that_changes_the_result_is_refused_and_names_the_keys(six_step_run, tmp_path):
    out = copy_run(six_step_run[0], tmp_path / "run")
    stored = (out / "recipe.yaml").read_text()
    before = sorted(p.name for p in (out / "checkpoints").iterdir())
    # The recipe file as given (not shrunk like the run) and a new seed: both change what is trained.
    proc = run_cli("train", SMOKE, "--output-dir", out, "--resume", "auto", "--set", "train.seed=7")
    assert proc.returncode == 2
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("llama-npu: error: resume: the recipe changes ")
    for change in ("data.max_seq_len 32 -> 128", "train.micro_batch_size 2 -> 1", "train.seed 0 -> 7"):
        assert change in error
    assert "train.max_steps" not in error and "--force" in error  # refused only for what changes the result
    assert (out / "recipe.yaml").read_text() == stored
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == before


def test_resume_may_extend_the_run_and_keeps_the_stored_recipe(six_step_run, tmp_path):
    out = copy_run(six_step_run[0], tmp_path / "run")
    stored = (out / "recipe.yaml").read_text()
    proc = run_cli("train", "--resume", "auto", "--output-dir", out, "--set", "train.max_steps=7", check=True)
    assert "resuming with train.max_steps 6 -> 7, unlike" in proc.stdout
    assert [r["step"] for r in read_metrics(out)] == list(range(1, 8))
    assert (out / "recipe.yaml").read_text() == stored


def test_the_printed_command_carries_what_a_resume_changed(tmp_path):
    from llama_npu.cli import build_parser
    from llama_npu.recipe.load import load_recipe
    from llama_npu.training.preflight import resume_command
    from llama_npu.training.request import run_request as _run_request

    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.yaml").write_text(yaml.safe_dump(load_recipe(SMOKE, ["train.max_steps=6"]).to_dict()))
    # What a run resumed with these changes (and --force for the seed) trains.
    recipe = load_recipe(run / "recipe.yaml", ["train.max_steps=9", "train.optimizer.lr=1e-4", "train.seed=3",
                                               "data.eval_files=[]", "strategies.precision.amp_level=O2",
                                               "strategies.precision.loss_scale=static:1024"])
    command = shlex.split(resume_command(run, recipe))
    assert command[:6] == ["llama-npu", "train", "--resume", "auto", "--output-dir", str(run)]
    assert command[-1] == "--force"
    assert _run_request(build_parser().parse_args(command[1:]))[0] == recipe


@pytest.fixture(scope="module")
def long_run(tmp_path_factory):
    """150 tiny steps, then SIGTERM and, once it is acknowledged, SIGTERM again."""
    base = tmp_path_factory.mktemp("long")
    out = base / "run"
    proc = start_training(out, *TINY_RUN, "--set", "train.max_steps=1000", "--set", "train.save_every=50",
                          "--set", "train.keep_last=2", log_dir=base / "logs")
    wait_until(lambda: metric_lines(out) >= 150, proc, "150 steps")
    proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "SIGTERM received" in (base / "logs" / "stdout").read_text(), proc, "the first SIGTERM")
    proc.send_signal(signal.SIGTERM)
    return out, proc.wait(timeout=60)


def test_host_memory_does_not_grow_step_after_step(long_run):
    out, _ = long_run
    rss = {r["step"]: r["host_rss_bytes"] for r in read_metrics(out)}
    # From after the first checkpoint (step 50): the first graph step after its weight check
    # (a PyNative op over the weights) grows the CPU memory pool once, by about 10 MiB with
    # the one-graph train step; from then on RSS is flat (+0.05 MiB over 70 steps, measured).
    warm = np.median([rss[s] for s in range(60, 81)])
    late = np.median([rss[s] for s in range(130, 151)])
    growth_mib = (late - warm) / 2**20
    # Keeping one step's logits (2 x 33 x 128,256 floats, 32 MiB) would fail this, as would
    # keeping 80 KiB a step (5.5 MiB over the 70 steps).
    assert growth_mib < 4, f"host RSS grew {growth_mib:.1f} MiB from steps 60-80 to 130-150"


def test_second_signal_exits_at_once_and_keeps_the_last_checkpoint(long_run, ms):
    from llama_npu.checkpoints.files import read_state, step_dirs_newest_first

    out, returncode = long_run
    assert returncode == 128 + signal.SIGTERM  # ended at once, as a shell reports a death by the signal
    assert not (out / "summary.json").exists()
    # The second signal may land while step 150 is being saved: what is visible must still be
    # complete (the partial save stays hidden), and hold the step before it at the least.
    visible = step_dirs_newest_first(out / "checkpoints")
    assert all(read_state(p) is not None for p in visible)
    newest = visible[0]
    assert int(newest.name[5:]) >= 100
    for name in ("model.ckpt", "optimizer.ckpt"):  # complete and CRC-intact
        assert ms.load_checkpoint(str(newest / name), crc_check=True)


def test_nonfinite_streak_stops_the_run_and_saves_nothing_poisoned(six_step_run, tmp_path, ms):
    out = copy_run(six_step_run[0], tmp_path / "run")
    # A learning rate of 1e30 turns the first update into weights whose forward pass is
    # not finite: every step after it is skipped.
    proc = run_cli("train", SMOKE, "--output-dir", out, "--resume", "auto", *TINY_RUN, "--set", "train.max_steps=40",
                   "--set", "train.save_every=1", "--set", "train.optimizer.lr=1e30")
    assert proc.returncode == 1
    assert "not finite 10 times in a row (train.max_nonfinite_steps=10)" in proc.stderr
    rows = read_metrics(out)
    assert [r["nonfinite_in_a_row"] for r in rows[-10:]] == list(range(1, 11))
    assert all(r["overflow"] for r in rows[-10:]) and rows[-1]["step"] < 40
    # Only steps that ended finite were saved, and every saved weight is finite.
    saved = sorted(int(p.name[5:]) for p in (out / "checkpoints").glob("step_*"))
    assert saved[-1] == rows[-11]["step"]
    for step in saved:
        weights = ms.load_checkpoint(str(out / "checkpoints" / f"step_{step}" / "model.ckpt"))
        assert all(np.isfinite(v.asnumpy()).all() for v in weights.values())


def test_full_disk_stops_with_a_clear_error_and_the_last_checkpoint_intact(six_step_run, tmp_path):
    from llama_npu.checkpoints.files import read_state

    out = copy_run(six_step_run[0], tmp_path / "run")
    shutil.rmtree(out / "checkpoints" / "step_6")

    def small_disk():  # every file this process writes is capped at 16 MiB: model.ckpt needs 33
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))

    proc = run_cli("train", SMOKE, "--output-dir", out, "--resume", "auto", *SIX_STEPS, preexec_fn=small_disk)
    assert proc.returncode == 1
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("llama-npu: error: could not write the checkpoint of step 6")
    assert "File too large" in error and f"{out / 'checkpoints' / 'step_3'}, is intact" in error
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_3"]  # no partial left
    assert read_state(out / "checkpoints" / "step_3")["step"] == 3


def test_unwritable_output_directory_is_refused_before_training(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the run directory's parent should be")
    proc = run_cli("train", SMOKE, "--output-dir", blocker / "run", *TINY_RUN)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (f"llama-npu: error: output directory {blocker / 'run'} is not "
                                                    f"writable: {blocker} is a file, not a directory")


def test_damaged_checkpoints_are_skipped_on_resume(six_step_run, tmp_path):
    reference = six_step_run[0]
    out = copy_run(reference, tmp_path / "run")
    ckpts = out / "checkpoints"
    shutil.copytree(ckpts / "step_6", ckpts / "step_9")
    (ckpts / "step_9" / "state.json").unlink()  # died before its sidecar
    shutil.copytree(ckpts / "step_6", ckpts / "step_8")
    state = json.loads((ckpts / "step_8" / "state.json").read_text())  # a step of its own number
    (ckpts / "step_8" / "state.json").write_text(json.dumps(dict(state, step=8)))
    with open(ckpts / "step_8" / "model.ckpt", "r+b") as fh:  # truncated weights
        fh.truncate(1000)
    with open(ckpts / "step_6" / "model.ckpt", "r+b") as fh:  # same size, damaged bytes
        fh.seek(fh.seek(0, 2) // 2)
        fh.write(b"\xde\xad\xbe\xef" * 4)

    proc = run_cli("train", SMOKE, "--output-dir", out, "--resume", "auto", *SIX_STEPS, check=True)
    assert re.search(r"skipping checkpoint \S*step_9: sidecar state.json unreadable", proc.stderr)
    assert re.search(r"skipping checkpoint \S*step_8: model.ckpt has 1000 bytes, expected \d+", proc.stderr)
    assert re.search(r"skipping checkpoint \S*step_6: \S*model.ckpt is damaged or unreadable", proc.stderr)
    assert f"resumed from {ckpts / 'step_3'} at step 3" in proc.stdout
    assert_same_steps(out, reference, (4, 5, 6))


def test_resume_without_any_complete_checkpoint_says_so_and_deletes_nothing(six_step_run, tmp_path):
    out = copy_run(six_step_run[0], tmp_path / "run")
    for step in (3, 6):
        (out / "checkpoints" / f"step_{step}" / "state.json").unlink()
    proc = run_cli("train", SMOKE, "--output-dir", out, "--resume", "auto", *SIX_STEPS)
    assert proc.returncode == 2
    assert f"none of the checkpoints under {out / 'checkpoints'} is complete (step_6: sidecar" in proc.stderr
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_3", "step_6"]


def test_training_shows_progress_time_left_and_what_is_slow(six_step_run):
    _, proc = six_step_run
    assert re.search(r"train: .*6/6 \[\d\d:\d\d<00:00", proc.stderr)  # count, elapsed<remaining
    assert re.search(r"tokenize: .*\d+/230 \[", proc.stderr)
    for phase in ("tokenizing data/zh_instruct_train.jsonl", "building the model", "the first step compiles"):
        assert phase in proc.stdout


# ---------------------------------------------------------------- nothing written before the run can start

def test_validate_lists_every_startup_problem_and_train_refuses_before_writing(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("the user's own file")
    no_record = tmp_path / "sharegpt.jsonl"
    no_record.write_text('{"conversations": [{"from": "human", "value": "hi"}]}\n')
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "config.json").write_text(json.dumps({"format": "llama-npu", "shape": {
        "hidden_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 256,
        "vocab_size": 128256}}))
    args = [SMOKE, "--output-dir", out, "--set", "device.target=ascend", "--set", "device.name=910b",
            "--set", f"data.train_files=[{no_record}]", "--set", f"data.eval_files=[{tmp_path / 'gone.jsonl'}]",
            "--set", f"model.checkpoint={weights}"]
    proc = run_cli("validate", *args, "--strict-device")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 5 and all(line.startswith("llama-npu: error: ") for line in lines)
    for line, expected in zip(lines, [
            "device.target=ascend (device.name=910b): this host has no Ascend NPU",
            f"data.format=alpaca: no record of {no_record} parses; the first: {no_record}:1: read as alpaca, but "
            f"the record has 'conversations', a sharegpt field: set data.format: sharegpt in the recipe",
            f"{tmp_path / 'gone.jsonl'}: file not found",
            f"model.checkpoint={weights} holds hidden 128",
            f"output directory {out} is not empty"]):
        assert expected in line

    proc = run_cli("train", *args)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "llama-npu: error: device.target=ascend (device.name=910b): this host has no Ascend NPU")
    assert "(and 4 more: llama-npu validate with the same arguments lists them all)" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


@pytest.mark.skipif(bool(glob.glob("/dev/davinci[0-9]*")), reason="this host has an Ascend NPU")
def test_validate_without_the_device_checks_the_rest_at_the_recipes_layout():
    """On a host without the recipe's NPU (a login node), validate checks everything else at
    the layout the recipe will be launched with (8 workers), exits 0 and says in one line that
    the device check is left for a host with the device; --strict-device makes it exit 2."""
    recipe = REPO / "recipes" / "llama3_2_3b_zh_full_8x910b.yaml"
    proc = run_cli("validate", recipe)
    assert proc.returncode == 0, proc.stderr
    # the tokenizing notes of the data-size check ("[llama-npu] ..."), then the verdict and the device line
    lines = [line for line in proc.stdout.strip().splitlines() if not line.startswith("[llama-npu]")]
    assert len(lines) == 2 and lines[0].startswith(f"{recipe}: valid; 8 worker(s)")
    assert lines[1].startswith("llama-npu: device check left for a host with the device: this host has no Ascend "
                               "NPU (no /dev/davinci*) for device.name=910b; everything else was checked for 8 worker")
    strict = run_cli("validate", recipe, "--strict-device")
    assert strict.returncode == 2 and strict.stderr.count("\n") == 1
    assert strict.stderr.startswith("llama-npu: error: device.target=ascend (device.name=910b): this host has no "
                                    "Ascend NPU")
    broken = run_cli("validate", recipe, "--set", "data.eval_files=[gone.jsonl]")
    assert broken.returncode == 2
    assert broken.stderr.strip().splitlines()[0] == "llama-npu: error: gone.jsonl: file not found"
    assert "device check left for a host with the device" in broken.stderr and "workers, but" not in broken.stderr


OFFLOAD_3B = REPO / "recipes" / "llama3_2_3b_zh_full_offload_910a.yaml"


def test_train_refuses_a_host_without_the_memory_for_the_optimizer_in_one_line(tmp_path):
    """The shipped offload recipe on this host's CPU with 1,000 layers of the 3B: the planner's
    host figure (fp32 master, moments and accumulators, 16 bytes a parameter) is about 1.5 TB,
    beyond any CI host's MemAvailable. train refuses in one line naming both, exit 2, before
    the output directory exists; the same shape with the optimizer on the card is not refused
    for it."""
    from llama_npu.training.preflight import mem_available

    cpu = ("--set", "device.target=cpu", "--set", "device.name=cpu", "--set", "model.num_layers=1000")
    out = tmp_path / "run"
    proc = run_cli("train", OFFLOAD_3B, *cpu, "--output-dir", out)
    assert proc.returncode == 2 and not out.exists() and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[0]
    need = re.search(r"this node's host needs ([\d.]+) GiB .* \(1 rank x ([\d.]+) GiB, llama-npu plan RECIPE\), but "
                     r"MemAvailable is ([\d.]+) GiB", line)
    assert line.startswith("llama-npu: error: strategies.offload.optimizer=host: ") and need, line
    assert float(need.group(1)) > float(need.group(3)) > 0
    assert abs(float(need.group(3)) - mem_available() / 2**30) < 2  # this host's, read as train ran
    validate = run_cli("validate", OFFLOAD_3B, *cpu, "--set", "strategies.offload.optimizer=device")
    assert "MemAvailable" not in validate.stderr


@pytest.mark.skipif(bool(glob.glob("/dev/davinci[0-9]*")), reason="this host has an Ascend NPU")
def test_validate_on_a_login_node_leaves_the_host_memory_check_with_the_device_check():
    """The shipped offload recipe needs 48.61 GB of host memory a rank (more than this host's
    MemAvailable allows a test to rely on); on a host without its 910A, validate exits 0 and
    says the host-memory and host-kernel checks are left for the host with the device. Its
    rehearsal checks its own, shrunk, figure (and this host's kernel) and is valid here."""
    proc = run_cli("validate", OFFLOAD_3B)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1].endswith(
        "; so are the host-memory check of strategies.offload.optimizer=host (48.61 GiB a rank against that host's "
        "MemAvailable) and the check of its AdamW kernel (numba importable, at the offload extra's release, one "
        "update right)")
    rehearsal = run_cli("validate", OFFLOAD_3B, "--rehearse")
    assert rehearsal.returncode == 0 and "valid as a rehearsal" in rehearsal.stdout, rehearsal.stderr


def test_prepared_data_made_for_another_length_is_refused_before_tokenizing(tmp_path):
    from llama_npu.data.tokenizer import tokenizer_identity

    prepared = tmp_path / "prepared"
    prepared.mkdir()
    (prepared / "data.mindrecord").write_bytes(b"")
    (prepared / "meta.json").write_text(json.dumps({"max_seq_len": 64, "tokenizer": tokenizer_identity("llama3.2")}))
    proc = run_cli("train", SMOKE, "--output-dir", tmp_path / "run", *TINY_RUN, "--set", "data.train_files=[]",
                   "--set", f"data.prepared={prepared}")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"llama-npu: error: data.prepared={prepared} was prepared with --max-seq-len 64, but data.max_seq_len=32")
    assert "tokenizing" not in proc.stdout and not (tmp_path / "run").exists()


def test_prepared_data_missing_one_of_its_files_is_refused_before_anything_is_written(tmp_path):
    """A prepared dataset written as several files (data/mindrecord.py ROWS_A_FILE) with one
    of them gone: train names it and writes no run."""
    from llama_npu.data.tokenizer import tokenizer_identity

    prepared = tmp_path / "prepared"
    prepared.mkdir()
    (prepared / "data.mindrecord").write_bytes(b"")
    (prepared / "meta.json").write_text(json.dumps({"max_seq_len": 32, "tokenizer": tokenizer_identity("llama3.2"),
                                                    "files": ["data.mindrecord", "data.mindrecord.1"]}))
    proc = run_cli("train", SMOKE, "--output-dir", tmp_path / "run", *TINY_RUN, "--set", "data.train_files=[]",
                   "--set", f"data.prepared={prepared}")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"llama-npu: error: data.prepared={prepared}: data.mindrecord.1 is missing; prepare it again")
    assert f"data.prepared={prepared} has no checksums.json (prepared by a llama-npu older than it)" in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("damaged", ["data.mindrecord", "meta.json", "checksums.json"])
def test_a_damaged_prepared_dataset_is_refused_by_name_before_a_row_is_read(tmp_path, damaged):
    """prepare-data seals its directory with checksums.json; a flipped byte in a row, in
    meta.json or in the manifest itself stops validate and train in one line naming the file,
    and train writes no run."""
    from llama_npu.data.prepare import prepare_dataset

    prepared = tmp_path / "prepared"
    prepare_dataset("alpaca", [str(REPO / "data" / "zh_instruct_train.jsonl")], prepared, max_seq_len=32)
    path = prepared / damaged
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    args = ["--set", "data.train_files=[]", "--set", f"data.prepared={prepared}"]
    why = (f"{path} is damaged or unreadable (its CRC-32 differs from the one checksums.json recorded)"
           if damaged != "checksums.json" else f"{path} is damaged (it no longer matches the CRC-32 it was sealed with)")
    validate = run_cli("validate", SMOKE, *args)
    assert validate.returncode == 2 and f"data.prepared={prepared}: {why}; prepare it again" in validate.stdout + \
        validate.stderr
    proc = run_cli("train", SMOKE, "--output-dir", tmp_path / "run", *TINY_RUN, *args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"llama-npu: error: data.prepared={prepared}: {why}; prepare it again"
    assert not (tmp_path / "run").exists()


def bad_after_three_good(tmp_path):
    data = tmp_path / "late_error.jsonl"
    good = (REPO / "data" / "zh_instruct_train.jsonl").read_text(encoding="utf-8").splitlines()[:3]
    data.write_text("\n".join(good + ['{"instruction": "x", "output": 3}']) + "\n", encoding="utf-8")
    return data


def test_a_bad_record_deep_in_the_data_stops_the_run_before_anything_is_written(tmp_path):
    data = bad_after_three_good(tmp_path)
    proc = run_cli("train", SMOKE, "--output-dir", tmp_path / "run", *TINY_RUN, "--set", f"data.train_files=[{data}]")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"llama-npu: error: {data}:4: field 'output' must be a string, got int; data.on_bad_record=skip "
        f"(prepare-data --on-bad-record skip) drops such records")
    assert not (tmp_path / "run").exists()


def test_ctrl_c_while_prepare_data_workers_write_leaves_nothing_and_no_process(tmp_path):
    """Ctrl-C reaches the whole process group: the parent stops its worker processes, which
    print nothing, removes what they wrote and exits 130 with one line."""
    base = (REPO / "data" / "zh_instruct_train.jsonl").read_text("utf-8").splitlines()
    src = tmp_path / "many.jsonl"
    src.write_text("".join(base[i % len(base)] + "\n" for i in range(100_000)), encoding="utf-8")
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "llama_npu", "prepare-data", "--format", "alpaca", "--input",
                                 str(src), "--output", str(tmp_path / "prepared"), "--max-seq-len", "1024",
                                 "--workers", "2"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=err,
                                env={**os.environ, "PYTHONPATH": path}, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        # the second worker has begun writing its own file
        wait_until(lambda: glob.glob(str(tmp_path / ".prepared.partial-*" / "data-1.mindrecord")), proc,
                   "the second worker's file")
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=120) == 128 + signal.SIGINT
    stderr = (tmp_path / "stderr").read_text()
    assert stderr.strip().splitlines()[-1] == "llama-npu: error: interrupted (SIGINT)" and "Traceback" not in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["many.jsonl", "stderr"]
    # No process of the group runs on (one that ended after the parent may stay a zombie
    # where nothing reaps orphans, as in a container without an init).
    table = subprocess.run(["ps", "-eo", "pgid=,stat=,args="], capture_output=True, text=True, check=True).stdout
    assert [row for row in table.splitlines() if row.split()[0] == str(proc.pid) and row.split()[1][0] != "Z"] == []


def test_a_signal_during_start_up_is_one_line_and_leaves_nothing_behind(tmp_path):
    out = tmp_path / "run"
    proc = start_training(out, *TINY_RUN, log_dir=tmp_path / "logs")
    # The run directory exists from the end of tokenizing; the model is built after it.
    wait_until((out / "recipe.yaml").exists, proc, "the run directory")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 128 + signal.SIGINT
    stderr = (tmp_path / "logs" / "stderr").read_text()
    assert stderr.strip().splitlines()[-1] == ("llama-npu: error: SIGINT received during start-up, before the "
                                               "first step; nothing of this run was kept")
    assert "Traceback" not in stderr
    assert not out.exists()


# ---------------------------------------------------------------- scripts/launch.sh fails fast

def test_launch_checks_the_output_directory_before_msrun(six_step_run, tmp_path):
    proc = run_launch(SMOKE, 2, "--output-dir", six_step_run[0], "--set", "strategies.parallel.data=2",
                      log_dir=tmp_path / "logs")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"llama-npu: error: output directory {six_step_run[0]} is not empty; pass --resume auto to continue it "
        f"or --overwrite to start again")
    assert not (tmp_path / "logs").exists()  # msrun never started


def test_data_that_leaves_no_sample_ends_the_launch_before_any_worker_starts(tmp_path):
    # Records that parse but whose prompts fill the 33 tokens, kept whole (data.truncation:
    # keep_prompt; the default keep_end would cut them to fit): the pre-flight tokenizes them (its
    # data-size check, as train does) and finds no sample left, before msrun starts.
    data = tmp_path / "long_prompts.jsonl"
    data.write_text("".join(json.dumps({"instruction": "长城" * 40, "output": "好。"}, ensure_ascii=False) + "\n"
                            for _ in range(4)), encoding="utf-8")
    # CLUSTER_TIME_OUT is left at its default, 600 s: the launch must not wait it out.
    proc = run_launch(SMOKE, 2, "--output-dir", tmp_path / "run", *TINY_RUN, "--set", "strategies.parallel.data=2",
                      "--set", f"data.train_files=[{data}]", "--set", "data.truncation=keep_prompt",
                      log_dir=tmp_path / "logs")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert re.fullmatch(rf"llama-npu: error: no training sample left in {re.escape(str(data))}: all 4 "
                        rf"records were dropped, .*", proc.stderr.strip().splitlines()[-1])
    assert not (tmp_path / "logs" / "worker_0.log").exists()  # no worker started
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- scripts/launch.sh keeps the work (#19)

def test_launch_stops_every_rank_on_a_signal_and_names_a_killed_rank(dp2_launch, tmp_path):
    """Two cells of scripts/fault_matrix.py (its whole table is in docs/multi-device.md),
    chained: kill -9 of rank 0 while it writes step 6, then Ctrl-C to launch.sh between two
    saves of the launch the kill's printed command started. The Ctrl-C's printed command runs
    to the end, and the run's losses must equal those of an uninterrupted launch of the same
    arguments (the session's shared one)."""
    reference, launched, _ = dp2_launch
    assert launched.returncode == 0, launched.stderr[-3000:]
    proc = subprocess.run([sys.executable, "scripts/fault_matrix.py", "--chain", "--cells", "sigkill_worker:mid_save",
                           "sigint_launch:mid_step", "--reference", str(reference), "--json",
                           str(tmp_path / "cells.json"), "--work", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kill, stop = json.loads((tmp_path / "cells.json").read_text())
    assert stop["exit_status"] == PREEMPTED, stop
    step = stop["ranks_stopped_at"][0]
    assert stop["ranks_stopped_at"] == [step, step]  # both ranks finished the same optimizer step
    assert stop["last_line"] == f"launch: every rank stopped after step {step} and saved it"
    assert (stop["resumed_from"], stop["steps_lost"], stop["exact"]) == (step, 0, True), stop
    # Each rank says it stopped; only rank 0, which saves, names the checkpoint.
    said = sorted(line for log in (tmp_path / "work").rglob("worker_*.log") for line in log.read_text().splitlines()
                  if line.startswith(f"llama-npu: stopped by SIGTERM after step {step}; "))
    assert len(said) >= 2 and "newest checkpoint: None" not in "\n".join(said), said
    # The console: the ranks' own lines, not msrun's error and traceback for the stop's status 75.
    console = (tmp_path / "work" / "sigint_launch-mid_step" / "logs" / "stdout").read_text()
    assert f"stopped by SIGTERM after step {step}" in console
    assert "Error code: 75" not in console and "Traceback" not in console and "\n[INFO] " not in console
    for noise in ("[WARNING] ME(", "[ERROR] ME(", "Start scheduler process", "RuntimeError"):  # msrun's own (#32)
        assert noise not in console, noise
    assert kill["exit_status"] == 128 + signal.SIGKILL, kill
    assert re.fullmatch(r"launch: rank 0 \(pid \d+\) was killed by SIGKILL; the newest step complete on every "
                        r"rank is intact", kill["last_line"]), kill
    assert (kill["resumed_from"], kill["steps_lost"], kill["exact"]) == (3, 3, True), kill  # step 6 died unwritten
