"""What a save killed outright leaves behind, and a second signal to scripts/launch.sh: the
next start repairs the run directory before it chooses the step to resume (#32)."""
import os
import shutil
import subprocess

from conftest import run_cli


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
