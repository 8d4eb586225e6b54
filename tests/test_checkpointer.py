"""Checkpoint rules, in-process on real MindSpore checkpoint files: rank agreement, what a
rank saves, rewinds, pruning, a stop that saves whatever the non-finite streak; and the bad
input of --resume through the real command line."""
import os
import shutil
import subprocess
from contextlib import contextmanager

import numpy as np
import pytest

from conftest import SIX_STEPS, SMOKE, TINY_RUN, run_cli

pytestmark = pytest.mark.usefixtures("ms")


def world(rank=0, size=1, sharded=False):
    from llama_npu.strategies.parallel import World

    return World(rank=rank, size=size, sharded=sharded)


def weights(ms, value=0.0, names=("w0", "w1")):
    return [ms.Parameter(ms.Tensor(np.full((4, 4), value, np.float32)), name=name) for name in names]


def write_steps(ms, root, steps):
    from llama_npu.checkpoints.files import save_checkpoint

    for step in steps:
        save_checkpoint(root, step, weights(ms, step), [], {"samples_consumed": step})


def damage(path):
    """Same size, different bytes: only a CRC notices."""
    with open(path, "r+b") as fh:
        fh.seek(fh.seek(0, 2) // 2)
        fh.write(b"\xde\xad\xbe\xef" * 4)


@pytest.mark.parametrize("rank_1_step_4", ["missing", "damaged"])
def test_every_rank_resumes_the_newest_step_complete_on_every_rank(ms, tmp_path, rank_1_step_4, capsys):
    from llama_npu.checkpoints.policy import Checkpointer
    from llama_npu.training.preflight import resume_candidates

    run = tmp_path / "run"
    for rank in (0, 1):
        write_steps(ms, run / "checkpoints" / f"rank_{rank}", [2, 4])
    if rank_1_step_4 == "missing":
        shutil.rmtree(run / "checkpoints" / "rank_1" / "step_4")
    else:
        damage(run / "checkpoints" / "rank_1" / "step_4" / "model.ckpt")
    candidates = resume_candidates(run, "auto")
    for rank in (0, 1):
        chosen = Checkpointer(run, world(rank, 2, sharded=True), keep_last=3).choose(candidates)
        assert chosen == run / "checkpoints" / f"rank_{rank}" / "step_2"
    if rank_1_step_4 == "damaged":
        assert "rank_1/step_4/model.ckpt is damaged or unreadable (its CRC-32 differs" in capsys.readouterr().err


def test_a_damaged_resume_path_is_refused_and_nothing_is_moved(ms, tmp_path):
    from llama_npu.checkpoints.files import CheckpointError
    from llama_npu.checkpoints.policy import Checkpointer

    root = tmp_path / "checkpoints"
    write_steps(ms, root, [3, 6])
    damage(root / "step_3" / "model.ckpt")
    with pytest.raises(CheckpointError, match=r"--resume \S+step_3: \S+model.ckpt is damaged or unreadable"):
        Checkpointer(tmp_path, world(), keep_last=3).choose([root / "step_3"])
    assert sorted(p.name for p in root.iterdir()) == ["step_3", "step_6"]


def test_a_rank_saves_only_the_parameters_its_graph_sliced_and_resumes_from_them(ms, tmp_path):
    """Two pipeline stages: rank 0's compile sets up stage 0's weight for its layout
    (`is_param_init`, mindspore/parallel AutoParallelPostProcess) and marks it `sliced`
    (mindspore/parallel/_utils.py); stage 1's copy on rank 0 is neither."""
    from llama_npu.checkpoints.files import CheckpointError, load_checkpoint
    from llama_npu.checkpoints.policy import Checkpointer

    class TwoStages(ms.nn.Cell):
        def __init__(self):
            super().__init__()
            self.stage0, self.stage1 = weights(ms, 1.0, ("model.layers.0.w", "model.layers.1.w"))

    net = TwoStages()
    optimizer = ms.nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    compiled = [net.stage0, *[p for p in optimizer.get_parameters() if "layers.1" not in p.name]]
    for p in compiled:
        p.sliced = p.param_info.is_param_init = True
    path = Checkpointer(tmp_path, world(0, 2, sharded=True), keep_last=1).save(
        5, net.trainable_params(), optimizer, {"samples_consumed": 10})
    assert sorted(ms.load_checkpoint(str(path / "model.ckpt"))) == ["model.layers.0.w"]
    assert not [name for name in ms.load_checkpoint(str(path / "optimizer.ckpt")) if "layers.1" in name]
    # Resuming checks for the weights this rank owns, not for the other stage's.
    assert load_checkpoint(path, net, optimizer)["step"] == 5
    for p in compiled:  # unsharded, every weight is this rank's, and stage 1's is missing
        p.param_info.is_param_init = False
    with pytest.raises(CheckpointError, match="lacks trained weights: model.layers.1.w"):
        load_checkpoint(path, net, optimizer)


def parameter(ms, name, sliced=False, lazy=False, shared=False, parallel=False):
    """A Parameter in one state MindSpore's cell save tells apart: sliced by a compile or not,
    never initialised (has_init, built under no_init_parameters) or not, a pipeline's shared
    copy or not, set up for a parallel layout (is_param_init) or not."""
    from mindspore.common.initializer import initializer

    if lazy:
        with ms.nn.utils.no_init_parameters():
            p = ms.Parameter(initializer("ones", (2, 2), ms.float32), name=name)
    else:
        p = ms.Parameter(ms.Tensor(np.ones((2, 2), np.float32)), name=name)
    assert p.has_init == lazy
    p.sliced = sliced
    p.param_info.is_pipeline_shared_param = shared
    p.param_info.is_param_init = parallel
    return p


@pytest.mark.parametrize("parallel", [False, True], ids=["no_parameter_init_for_a_layout", "parallel_layout"])
def test_a_save_keeps_exactly_what_mindspores_cell_save_keeps(ms, tmp_path, parallel):
    """owned() against a real mindspore.save_checkpoint(cell) of the same parameters, read back
    (mindspore/train/serialization.py, _convert_cell_param_and_names_to_dict)."""
    from llama_npu.checkpoints.files import owned

    class Holder(ms.nn.Cell):
        def __init__(self, params):
            super().__init__()
            for p in params:
                setattr(self, p.name, p)

    states = [dict(), dict(sliced=True), dict(sliced=True, lazy=True), dict(lazy=True),
              dict(sliced=True, shared=True), dict(shared=True), dict(sliced=True, parallel=parallel)]
    cell = Holder([parameter(ms, f"p{i}", **state) for i, state in enumerate(states)])
    ours = sorted(p.name for p in owned(cell.get_parameters()))  # before the save: it initialises lazy ones
    ms.save_checkpoint(cell, str(tmp_path / "cell.ckpt"))
    assert ours == sorted(ms.load_checkpoint(str(tmp_path / "cell.ckpt")))
    assert ours == (["p1", "p6"] if parallel else ["p0", "p1", "p2", "p3", "p6"])


def test_pruning_counts_only_complete_checkpoints(ms, tmp_path):
    from llama_npu.checkpoints.files import prune

    root = tmp_path / "checkpoints"
    write_steps(ms, root, [1, 2, 3, 4, 5])
    (root / "step_4" / "state.json").unlink()  # died before its sidecar
    with open(root / "step_5" / "model.ckpt", "r+b") as fh:
        fh.truncate(100)
    assert [p.name for p in prune(root, keep_last=2)] == ["step_1"]
    assert sorted(p.name for p in root.iterdir()) == ["step_2", "step_3", "step_4", "step_5"]


def test_a_save_removes_what_a_killed_save_left_and_nothing_of_a_live_one(ms, tmp_path):
    """SIGKILL mid-save leaves `.step_N.partial-PID`; the run's next save deletes it, but not
    the staging directory of a process that is still alive (the parent pytest stands in)."""
    from llama_npu.checkpoints.policy import Checkpointer

    gone = subprocess.Popen(["true"])
    gone.wait()
    root = tmp_path / "checkpoints"
    killed = root / f".step_4.partial-{gone.pid}"
    live = root / f".step_4.partial-{os.getppid()}"
    for staging in (killed, live):
        staging.mkdir(parents=True)
        (staging / "model.ckpt").write_bytes(b"half a checkpoint")
    params = weights(ms)
    Checkpointer(tmp_path, world(), keep_last=3).save(5, params, ms.nn.SGD(params), {})
    assert sorted(p.name for p in root.iterdir()) == [live.name, "step_5"]


def test_a_rewind_sets_the_later_branch_aside_and_auto_continues_the_new_one(ms, tmp_path, capsys):
    """Run to step 6, resume from step 3 into the same directory (keep_last 2): the new
    branch's steps 4 and 5 are kept, step 6 of the old branch is moved aside, not deleted,
    and a later --resume auto picks step 5."""
    from llama_npu.checkpoints.policy import Checkpointer
    from llama_npu.training.preflight import resume_candidates

    root = tmp_path / "checkpoints"
    write_steps(ms, root, [2, 3, 6])
    checkpointer = Checkpointer(tmp_path, world(), keep_last=2)
    checkpointer.start_branch(3)
    aside = root / "set_aside" / "after_step_3"
    assert f"resume: moved step_6 (later than step_3, another branch) aside to {aside}" in capsys.readouterr().out
    for step in (4, 5):
        checkpointer.save(step, weights(ms, 10.0 + step), ms.nn.SGD(weights(ms)), {"samples_consumed": step})
    assert sorted(p.name for p in root.iterdir()) == ["set_aside", "step_4", "step_5"]
    assert sorted(p.name for p in aside.iterdir()) == ["step_6"]
    assert resume_candidates(tmp_path, "auto")[0] == root / "step_5"
    checkpointer.start_branch(3)  # a second rewind to the same step keeps the first one's set-aside
    assert (root / "set_aside" / "after_step_3_2" / "step_4").is_dir() and (aside / "step_6").is_dir()


def test_a_stop_saves_even_after_a_skipped_step(ms, tmp_path):
    """fp16 with a static loss scale of 2**20 overflows every step: each is skipped, the
    streak grows, and the stop still writes the (unchanged, finite) weights."""
    from llama_npu.common.stopping import StopSignals
    from llama_npu.data.source import training_source
    from llama_npu.data.tokenizer import load_tokenizer
    from llama_npu.recipe.load import load_recipe
    from llama_npu.training.loop import run_loop
    from llama_npu.training.session import setup

    recipe = load_recipe(SMOKE, [arg for arg in TINY_RUN if arg != "--set"] + [
        "train.max_steps=3", "train.save_every=100", "train.max_nonfinite_steps=0",
        "strategies.precision.amp_level=O2", "strategies.precision.loss_scale=static:1048576"])
    session = setup(recipe, tmp_path, training_source(recipe, load_tokenizer(recipe.data.tokenizer)), [],
                    on_ascend=False)
    signals = StopSignals()
    signals.received = "SIGTERM"  # as the watcher thread sets it
    summary = run_loop(session, signals)
    assert (summary["steps"], summary["stopped_by"]) == (1, "SIGTERM")
    assert summary["checkpoint"] == str(tmp_path / "checkpoints" / "step_1")
    from llama_npu.checkpoints.files import problem
    assert problem(tmp_path / "checkpoints" / "step_1") is None


# ---------------------------------------------------------------- bad input to --resume

def test_resume_from_an_incomplete_path_is_one_line_and_moves_nothing(six_step_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(six_step_run[0], out)
    (out / "checkpoints" / "step_3" / "state.json").unlink()
    proc = run_cli("train", "--output-dir", out, "--resume", out / "checkpoints" / "step_3")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"llama-npu: error: --resume {out / 'checkpoints' / 'step_3'}: not a complete checkpoint directory "
        f"(sidecar state.json unreadable ([Errno 2] No such file or directory: "
        f"'{out / 'checkpoints' / 'step_3' / 'state.json'}')); expected a step_<N> directory holding model.ckpt, "
        f"optimizer.ckpt and state.json"]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_3", "step_6"]


@contextmanager
def unwritable(path):
    """No write permission on `path`, for root too: root passes every mode check, not the
    immutable attribute."""
    as_root = os.geteuid() == 0
    mode = path.stat().st_mode
    path.chmod(0o555)
    if as_root:
        subprocess.run(["chattr", "+i", str(path)], check=True)
    try:
        yield
    finally:
        if as_root:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(mode)


def test_a_rewind_whose_later_checkpoints_cannot_be_moved_is_refused_before_writing(six_step_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(six_step_run[0], out)
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    root = out / "checkpoints"
    with unwritable(root):
        proc = run_cli("train", "--output-dir", out, "--resume", root / "step_3", *SIX_STEPS)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"llama-npu: error: resume: step_6 under {root} (later than step_3) must be moved aside so the resumed "
        f"run's own checkpoints are the newest, but {root} is not writable; fix the permissions, or resume into "
        f"another --output-dir")
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before


def test_a_run_directory_as_model_checkpoint_is_refused_naming_the_step_to_give(six_step_run, tmp_path):
    """The hand-off from an SFT run to a new run from its weights (DPO after SFT): model.checkpoint
    takes one of the run's steps, and a run directory is refused with the step to give, which then validates."""
    run = six_step_run[0]
    refused = run_cli("validate", SMOKE, "--set", f"model.checkpoint={run}", "--output-dir", tmp_path / "a")
    step = run / "checkpoints" / "step_6"
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert (f"model.checkpoint={run}: a run directory; give one of its steps, such as its newest complete one: "
            f"model.checkpoint={step}") in refused.stderr
    accepted = run_cli("validate", SMOKE, "--set", f"model.checkpoint={step}", "--output-dir", tmp_path / "b")
    assert accepted.returncode == 0, accepted.stderr
