"""What a save killed outright leaves behind, and a second signal to scripts/launch.sh: the
next start repairs the run directory before it chooses the step to resume (#32)."""
import os
import shutil
import signal
import subprocess

from conftest import free_port, run_cli, wait_until


def dead_pid() -> int:
    """The PID of a process that has exited (and been reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_the_next_start_restores_an_interrupted_resave_and_removes_killed_saves(six_step_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(six_step_run[0], out)
    ckpts = out / "checkpoints"
    sidecar = (ckpts / "step_6" / "state.json").read_text()
    # A re-save of step 6 killed between its two renames: the old copy set aside, the new one
    # complete under its staging name, no step_6. And a save of step 9 killed half-way.
    pid, other = dead_pid(), dead_pid()
    os.rename(ckpts / "step_6", ckpts / f".step_6.old-{pid}")
    shutil.copytree(ckpts / f".step_6.old-{pid}", ckpts / f".step_6.partial-{pid}")
    shutil.copytree(ckpts / "step_3", ckpts / f".step_9.partial-{other}")
    (ckpts / f".step_9.partial-{other}" / "state.json").unlink()

    proc = run_cli("train", "--resume", "auto", "--output-dir", out, check=True)
    assert (f"restored {ckpts / 'step_6'} from .step_6.old-{pid}: a re-save of step_6 by process {pid} was killed "
            f"between its two renames") in proc.stdout
    assert f"removed {ckpts / f'.step_6.partial-{pid}'}: a save of step_6 by process {pid}" in proc.stdout
    assert f"removed {ckpts / f'.step_9.partial-{other}'}: a save of step_9 by process {other}" in proc.stdout
    assert f"resumed from {ckpts / 'step_6'} at step 6" in proc.stdout  # no step lost
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_3", "step_6"]
    assert (ckpts / "step_6" / "state.json").read_text() == sidecar


def test_a_resave_held_by_a_live_process_is_refused_and_left_as_it_is(six_step_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(six_step_run[0], out)
    ckpts = out / "checkpoints"
    retired = ckpts / f".step_6.old-{os.getpid()}"  # this test's own process: alive
    os.rename(ckpts / "step_6", retired)
    proc = run_cli("train", "--resume", "auto", "--output-dir", out)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"llama-npu: error: resume: step_6 is being re-saved by process {os.getpid()}, still alive ({retired}); "
        f"stop the run that writes {ckpts} first")
    assert sorted(p.name for p in ckpts.iterdir()) == [retired.name, "step_3"]


def text(path) -> str:
    return path.read_text() if path.exists() else ""


def processes_naming(path) -> list:
    """PIDs of the live processes whose command line names `path` (the launch's workers)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if str(path).encode() in fh.read():
                    found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


def test_a_second_signal_to_launch_sh_ends_everything_at_once_and_keeps_the_last_checkpoint(six_step_run, tmp_path):
    from llama_npu.checkpoints.files import inspect, step_dirs_newest_first

    out = tmp_path / "run"
    shutil.copytree(six_step_run[0], out)
    logs = tmp_path / "logs"
    env = {**os.environ, "MASTER_PORT": str(free_port()), "LOG_DIR": str(logs)}
    launch = subprocess.Popen(["bash", "scripts/launch.sh", str(out / "recipe.yaml"), "1", "--output-dir", str(out),
                               "--resume", "auto", "--set", "train.max_steps=1000", "--set", "train.save_every=1"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # A step of the resumed run is done: the first signal's stop then saves the next one.
    wait_until(lambda: "step 7" in text(out / "metrics.jsonl").replace('"step": ', "step "), launch, "step 7")
    launch.send_signal(signal.SIGTERM)
    wait_until(lambda: "SIGTERM received" in text(logs / "worker_0.log"), launch, "the stop request")
    launch.send_signal(signal.SIGTERM)
    _, stderr = launch.communicate(timeout=30)
    assert launch.returncode == 128 + signal.SIGTERM, stderr
    assert stderr.strip().splitlines()[-1] == ("launch: second SIGTERM: every worker killed; a checkpoint being "
                                               "written is left as a hidden partial directory")
    assert processes_naming(out) == []  # no worker, no msrun left behind
    visible = step_dirs_newest_first(out / "checkpoints")
    assert all(inspect(path, verify=True)[1] is None for path in visible)  # complete, every CRC intact
    assert "step_6" in {path.name for path in visible}  # the checkpoint the launch resumed from
