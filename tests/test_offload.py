"""strategies.offload (optimizer: host) against the in-graph optimizer on the same recipe and
batches (CPU, GRAPH_MODE): the same losses and weights, overflow skipped on both, and what
the compiled graph holds."""
import numpy as np
import pytest

from llama_npu.recipe.load import load_recipe
from llama_npu.strategies.offload import OffloadSection, host_threads

from conftest import REPO, SMOKE, run_cli

SEQ = 32
HOST = "strategies.offload.optimizer=host"
FP32 = ("train.optimizer.weight_decay=0.1", "train.grad_clip=0", "train.warmup_steps=2", "train.max_steps=10",
        "train.optimizer.lr=1e-3")
# O2 fp16, dynamic loss scale, accumulation k = 4, full recompute, chunked CE, clipping.
FP16 = ("strategies.precision.amp_level=O2", "strategies.precision.dtype=float16",
        # The first step's scale, 2^24 / its tokens, overflows fp16 in the backward: injected overflow;
        # lowered by 2^12 it trains.
        "strategies.precision.loss_scale=dynamic", "strategies.precision.loss_scale_init=16777216",
        "strategies.precision.loss_scale_factor=4096",
        "strategies.recompute.mode=full", "strategies.chunked_ce.enabled=true",
        "strategies.chunked_ce.chunk_size=16", "train.grad_clip=0.5", "train.optimizer.weight_decay=0.1",
        "train.warmup_steps=1", "train.max_steps=4", "train.optimizer.lr=1e-3", "train.micro_batch_size=2",
        "train.global_batch_size=8")
# A larger shape than the tiny preset, through model.* overrides.
LARGER = ("model.hidden_size=128", "model.num_layers=3", "model.num_heads=4", "model.num_kv_heads=2",
          "model.intermediate_size=352")


def recipe(*overrides):
    return load_recipe(SMOKE, [f"data.max_seq_len={SEQ}", "data.eval_files=[]", "train.global_batch_size=0",
                               *overrides])


def batches(steps, k, seed=0, rows=2):
    """`steps` lists of k micro-batches (ids, labels) of random tokens, some labels masked."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        step = []
        for _ in range(k):
            ids = rng.integers(0, 128000, (rows, SEQ + 1)).astype(np.int32)
            labels = ids.copy()
            labels[:, :int(rng.integers(1, SEQ // 2))] = -100
            step.append((ids, labels))
        out.append(step)
    return out


def trainer(ms, *overrides):
    """(step_fn, weights(): {name: fp32 numpy}, recipe) as training/session.py builds them."""
    from llama_npu.strategies.accumulation import accumulation_steps
    from llama_npu.strategies.network import build_network
    from llama_npu.strategies.precision import LossScaler
    from llama_npu.steps.optimizer import build_optimizer
    from llama_npu.steps.host.build import host_optimizer
    from llama_npu.steps.graph_step import TrainStep

    r = recipe(*overrides)
    ms.set_seed(0)
    net, cell = build_network(r, on_ascend=False)
    params, scaler, k = net.trainable_params(), LossScaler(r.strategies.precision), accumulation_steps(r)
    host = host_optimizer(r, params)
    if host is not None:
        from llama_npu.steps.host.step import HostStep

        step = HostStep(cell, host, scaler, r.train.grad_clip, k)
        saved = host.master_params
    else:
        step = TrainStep(cell, build_optimizer(params, r.train), scaler, r.train.grad_clip, k)
        saved = params
    return step, (lambda: {p.name: p.asnumpy().astype(np.float32) for p in saved}), r


def train(ms, data, *overrides):
    """(step results, final weights, the step function)."""
    from llama_npu.steps.optimizer import lr_at

    step, weights, r = trainer(ms, *overrides)
    results = [step(micro, lr_at(i + 1, r.train)) for i, micro in enumerate(data)]
    return results, weights(), step


def held_matrices(step, cells) -> list:
    """The dtypes of the Parameters of a weight matrix's shape that the compiled `cells` of
    `step` hold, the parameter-sized tensors of the graph."""
    shapes = {tuple(p.shape) for p in step_weights(step) if len(p.shape) >= 2}
    params = {id(p): p for cell in cells for p in cell.get_parameters()}.values()
    return sorted(str(p.dtype) for p in params if tuple(p.shape) in shapes)


def step_weights(step):
    return step.host.card if hasattr(step, "host") else step.final.weights


def assert_same_weights(got, want, rtol):
    """Each weight within `rtol` relative, in its norm: ||got - want|| / ||want||."""
    assert got.keys() == want.keys()
    for name, w in want.items():
        assert np.linalg.norm(got[name] - w) / np.linalg.norm(w) < rtol, name


@pytest.mark.parametrize("shape", [(), LARGER], ids=["tiny", "larger"])
def test_fp32_adamw_on_the_host_equals_the_graph_over_10_steps(ms, shape):
    data = batches(2, 1) * 5  # two batches seen five times each: the loss falls
    want, want_w, _ = train(ms, data, *FP32, *shape)
    got, got_w, _ = train(ms, data, *FP32, *shape, HOST)
    assert [r.loss for r in got] == pytest.approx([r.loss for r in want], abs=1e-6)
    assert [r.grad_norm for r in got] == pytest.approx([r.grad_norm for r in want], rel=1e-4)
    assert want[-1].loss < want[1].loss - 0.1  # it trained, and the next forward saw each update
    assert_same_weights(got_w, want_w, 1e-6)


def test_o2_fp16_one_host_update_lands_within_the_derived_rounding_bound_of_the_graphs(ms):
    """O2 fp16, dynamic loss scale, k = 4, full recompute, chunked CE, clipping: each step starts
    the host from the graph's state, so both take one update from the same masters, moments and
    float16 card weights, and every difference must be one that steps/host/update_bound.py derives
    from fp32 rounding. (Free-running, a master one rounding apart can round to the neighbouring
    float16 weight, and the next forward amplifies it beyond any bound: on an AMD EPYC the
    4-step weights differed by 1.08e-5 relative where a Xeon gave less than 1e-5.) The injected
    overflow is skipped on both, the card's weights untouched; the compiled host graph holds no
    fp32 master and no moments."""
    from llama_npu.selftest.host_optimizer import set_host_states, states  # selftest's host_optimizer steps so too
    from llama_npu.steps.optimizer import lr_at
    from llama_npu.steps.host.update_bound import (adamw_difference_bound, clip_factor_difference,
                                                 float16_neighbours, loss_difference_bound)

    data = batches(2, 4) * 2
    host_step, _, r = trainer(ms, *FP16, HOST)
    graph_step, _, _ = trainer(ms, *FP16)
    host, opt = host_step.host, graph_step.optimizer
    card = lambda: {p.name: p.asnumpy().copy() for p in host.card}  # noqa: E731
    results, worst = [], 0.0
    for i, micro in enumerate(data):
        lr = lr_at(i + 1, r.train)
        before = states(graph_step.final.weights, opt.moments1, opt.moments2)
        set_host_states(host, before)
        card_before = card()
        got, want = host_step(micro, lr), graph_step(micro, lr)
        results.append((got, want))
        assert (got.overflow, got.loss_scale) == (want.overflow, want.loss_scale)
        most = max(int((labels[:, 1:] != -100).sum()) for _, labels in micro)
        assert abs(got.loss - want.loss) <= loss_difference_bound(want.loss, most, len(micro))
        after, host_after = states(graph_step.final.weights, opt.moments1, opt.moments2), \
            states(host.masters, host.moments1, host.moments2)
        on_card = card()
        if got.overflow:  # skipped: the card's weights bit for bit, the host's states as given
            assert all(np.array_equal(on_card[k], card_before[k]) for k in on_card)
            assert all(np.array_equal(h[k], b[k]) for h, b in zip(host_after, before) for k in b)
            continue
        rho = clip_factor_difference(got.grad_norm, want.grad_norm, r.train.grad_clip)
        for p in host.card:
            name = p.name
            bounds = adamw_difference_bound([s[name] for s in before], [s[name] for s in after], lr,
                                            r.train.optimizer, len(p.shape) >= 2, rho)
            for h, g, bound in zip(host_after, after, bounds):
                excess = np.abs(h[name].astype(np.float64) - g[name]) / np.maximum(bound, 1e-45)
                worst = max(worst, float(excess.max()))
                assert excess.max() <= 1, (name, float(excess.max()))
            assert np.array_equal(on_card[name], host_after[0][name].astype(on_card[name].dtype))  # pushed exactly
            if on_card[name].dtype == np.float16:
                assert float16_neighbours(on_card[name], after[0][name].astype(np.float16)).all(), name
    assert [(g.overflow, g.loss_scale) for g, _ in results] == [(True, 2.0 ** 24)] + [(False, 2.0 ** 12)] * 3
    assert results[-1][1].loss < results[1][1].loss  # it trained
    assert worst > 0  # the two sides did round differently: the bound was exercised, not idle
    # The compiled graphs' parameter-sized tensors: with the optimizer on the host, the card's fp16
    # matrices only; in the graph, an fp32 master, two moments and an accumulator for each.
    on_card = held_matrices(host_step, (host_step.micro, host_step.end))
    matrices = len(on_card)
    assert matrices > 10 and on_card == ["Float16"] * matrices
    assert held_matrices(graph_step, (graph_step.final, graph_step.accumulating)) == ["Float32"] * 4 * matrices


@pytest.fixture(scope="session")
def host_six_step_run(request, tmp_path_factory):
    """six_step_run's recipe and arguments with the optimizer on the host."""
    from conftest import SIX_STEPS, built_once, run_cli

    return built_once(request, tmp_path_factory, "host_six", lambda out: run_cli(
        "train", SMOKE, "--output-dir", out, *SIX_STEPS, "--set", HOST, check=True))


def resumed_at_3(run, tmp_path, *switch):
    """A copy of `run` without its step_6, resumed to step 6 with `switch`'s arguments."""
    import shutil

    from conftest import SIX_STEPS, run_cli

    out = tmp_path / "resumed"
    shutil.copytree(run, out)
    shutil.rmtree(out / "checkpoints" / "step_6")
    run_cli("train", SMOKE, "--output-dir", out, *SIX_STEPS, *switch, "--resume", "auto", check=True)
    return out


def test_the_host_checkpoint_holds_fp32_masters_and_moments_under_the_in_graph_names(ms, six_step_run,
                                                                                   host_six_step_run):
    def contents(run, name):
        loaded = ms.load_checkpoint(str(run / "checkpoints" / "step_3" / name))
        return {k: (str(v.dtype), v.shape) for k, v in loaded.items()}

    import re

    for name in ("model.ckpt", "optimizer.ckpt"):
        assert contents(host_six_step_run[0], name) == contents(six_step_run[0], name)
    stdout = host_six_step_run[1].stdout
    params = int(re.search(r"; ([\d,]+) trainable parameters", stdout).group(1).replace(",", ""))
    assert (f"the optimizer on the host: {host_threads(OffloadSection())} thread(s), {16 * params / 2**30:.2f} GiB of "
            f"fp32 master weights, moments and gradient accumulators in host memory; the card keeps float32 "
            f"weights") in stdout  # the smoke recipe trains in fp32
    host, device = (ms.load_checkpoint(str(run[0] / "checkpoints" / "step_3" / "optimizer.ckpt"))
                    for run in (host_six_step_run, six_step_run))
    for name in ("global_step", "learning_rate"):  # 3 updates; the third step's learning rate
        assert host[name].asnumpy().tolist() == pytest.approx(device[name].asnumpy().tolist(), rel=1e-7)
    assert {dtype for dtype, _ in contents(host_six_step_run[0], "model.ckpt").values()} == {"Float32"}


def test_a_run_resumes_from_host_to_device_and_back(ms, six_step_run, host_six_step_run, tmp_path):
    """Stopped at step 3 with the optimizer on the host, resumed without it (and the reverse):
    steps 4-6 are those of the run that did not switch."""
    from conftest import assert_same_steps

    host, device = host_six_step_run[0], six_step_run[0]
    assert_same_steps(resumed_at_3(host, tmp_path / "to_device"), host, range(1, 7))
    assert_same_steps(resumed_at_3(device, tmp_path / "to_host", "--set", HOST), device, range(1, 7))


def test_bfloat16_gradients_reach_the_host_accumulators_exactly(ms):
    """The 910B's compute dtype: the card hands out bf16 gradients, which MindSpore gives as
    ml_dtypes' numpy bfloat16 and torch.from_numpy refused (TypeError at the first micro-batch,
    found in review). Values exact in bf16 arrive exactly; the card keeps the matrix in bf16."""
    from mindspore import Parameter, Tensor

    from llama_npu.recipe.schema import OptimizerSection
    from llama_npu.steps.host.optimizer import HostAdamW

    card = [Parameter(Tensor(np.ones((4, 3), np.float32)), name="w"), Parameter(Tensor(np.ones(3, np.float32)), name="g")]
    host = HostAdamW(card, OptimizerSection(), 1, ms.bfloat16)
    assert card[0].dtype == ms.bfloat16 and card[1].dtype == ms.float32
    matrix, vector = np.arange(12, dtype=np.float32).reshape(4, 3) / 8, np.array([0.5, -2.0, 3.0], np.float32)
    host.accumulate([Tensor(matrix, ms.bfloat16), Tensor(vector)])
    host.accumulate([Tensor(matrix, ms.bfloat16), Tensor(vector)])
    assert np.array_equal(host.accumulators[0].numpy(), 2 * matrix.reshape(-1))
    assert np.array_equal(host.accumulators[1].numpy(), 2 * vector)


@pytest.mark.parametrize("overrides, message", [
    ((HOST, "train.optimizer.name=sgd"), "strategies.offload.optimizer=host with train.optimizer.name=sgd: the host "
                                         "runs AdamW only"),
    ((HOST, "strategies.lora.enabled=true"),
     "strategies.offload.optimizer=host with strategies.lora.enabled=true: the adapters' fp32 weights, gradients "
     "and moments take 0.1 MiB on the card"),
    ((HOST, "device.name=910b", "device.target=ascend", "strategies.parallel.model=2"),
     "strategies.offload.optimizer=host with strategies.parallel.model=2"),
    ((HOST, "device.name=910b", "device.target=ascend", "strategies.parallel.optimizer_shard=true",
      "strategies.parallel.data=2"), "strategies.offload.optimizer=host with strategies.parallel.optimizer_shard=true"),
    (("strategies.offload.threads=0",), "strategies.offload.threads: expected null (this rank's share of the node's "
                                        "cores) or 1 to 1024, got 0"),
    (("strategies.offload.threads=5000",), "strategies.offload.threads: expected null"),
    (("strategies.offload.optimizer=cpu",), "strategies.offload.optimizer: expected one of device, host, got 'cpu'"),
])
def test_what_offload_cannot_do_is_refused_naming_the_key(overrides, message):
    from llama_npu.recipe.problems import RecipeError

    with pytest.raises(RecipeError) as refused:
        recipe(*overrides)
    assert refused.value.problems[0].startswith(message)


def test_train_refuses_bad_offload_threads_in_one_line_before_writing(tmp_path):
    from conftest import run_cli

    proc = run_cli("train", SMOKE, "--output-dir", tmp_path / "run", "--set", HOST, "--set",
                   "strategies.offload.threads=-1")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith("strategies.offload.threads: expected null (this rank's "
                                                         "share of the node's cores) or 1 to 1024, got -1")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("shadow, said", [
    ("raise ImportError('a broken install')", "numba does not import (ImportError: a broken install)"),
    ("__version__ = '0.67.0'", "numba is 0.67.0, not 0.68.1"),
], ids=["unimportable", "another-release"])
def test_train_refuses_a_host_without_the_offload_kernel_in_one_line_before_writing(tmp_path, shadow, said):
    """A numba that fails to import, or of another release, shadowing the installed one
    (PYTHONPATH comes before site-packages): train refuses in pre-flight, before tokenizing,
    with the install command, and writes nothing."""
    import os

    from conftest import run_cli

    (tmp_path / "shadow" / "numba").mkdir(parents=True)
    (tmp_path / "shadow" / "numba" / "__init__.py").write_text(shadow + "\n")
    proc = run_cli("train", SMOKE, "--output-dir", tmp_path / "run", "--set", HOST,
                   env={"PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path / "shadow")])})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"llama-npu: error: strategies.offload.optimizer=host: the host's AdamW kernel cannot run here: {said}; "
        f"install it: pip install 'numba==0.68.1' (the offload extra: pip install -e '.[offload]')")
    assert not (tmp_path / "run").exists()


def test_a_rehearsal_keeps_the_host_optimizer_on_at_most_this_machines_cores():
    from llama_npu.training.rehearse import rehearse

    full = load_recipe(SMOKE.parent / "llama3_2_1b_zh_full_910a.yaml", [HOST, "strategies.offload.threads=1024"])
    rehearsal, changed, not_rehearsed = rehearse(full)
    assert rehearsal.strategies.offload.optimizer == "host" and rehearsal.strategies.offload.threads is None
    assert "strategies.offload.threads 1024 -> None (this machine's cores)" in changed
    assert "the card-host transfers: on the CPU the card's memory is the host's" in not_rehearsed


# ---------------------------------------------------------------- data parallel (2 workers, scripts/launch.sh)

# What the in-graph data-parallel check allows (tests/test_parallel.py): 1% of one step's update.
DP_WEIGHTS_ATOL = 0.01 * 3.0e-3


@pytest.fixture(scope="session")
def host_dp2_launch(request, tmp_path_factory, single_process_run):
    """One 2-worker launch with the optimizer on the host, 2 samples a rank: EIGHT_STEPS resumed
    from step 3 of the one-process run without offload (single_process_run, 4 samples a step),
    so it loads whole tensors into two ranks' ranges, and saves steps 6 and 8 gathered whole.
    (run dir, process); the worker logs are in the run's sibling `logs`."""
    import shutil

    from conftest import EIGHT_STEPS, built_once, run_launch

    def build(out):
        shutil.copytree(single_process_run, out)
        for late in ("step_6", "step_8"):
            shutil.rmtree(out / "checkpoints" / late)
        # --force: the layout changes (4 samples on one card -> 2 on each of two), the global batch does not
        return run_launch(SMOKE, 2, "--output-dir", out, *EIGHT_STEPS, "--set", HOST, "--resume", "auto", "--force",
                          log_dir=out.parent / "logs", env={"CLUSTER_TIME_OUT": "60"}, timeout=600)

    return built_once(request, tmp_path_factory, "host_dp2", build)


def test_data_parallel_with_the_optimizer_on_the_host_equals_one_process(ms, single_process_run, host_dp2_launch):
    """Steps 4-8 over 2 ranks, each host holding half the matrices' states, equal one process of
    the same global batch without offload, and the checkpoints rank 0 writes from every rank's
    range have the one-process run's names, shapes, dtypes and values."""
    import re

    from conftest import read_metrics

    out, proc = host_dp2_launch
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = [(out.parent / "logs" / f"worker_{rank}.log").read_text() for rank in (0, 1)]
    assert all(f"resumed from {out / 'checkpoints' / 'step_3'} at step 3" in log for log in logs)
    got, want = read_metrics(out), read_metrics(single_process_run)
    assert [r["step"] for r in got] == list(range(1, 9))
    for a, b in zip(got[3:], want[3:]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5) and a["samples_consumed"] == b["samples_consumed"]
    digests = {re.search(r"rank \d weights sha256 (\w+)", log).group(1) for log in logs}
    assert len(digests) == 1, "the ranks' cards must hold bit-identical weights"
    for step in (6, 8):
        for name in ("model.ckpt", "optimizer.ckpt"):
            saved, single = (ms.load_checkpoint(str(run / "checkpoints" / f"step_{step}" / name))
                             for run in (out, single_process_run))
            assert {k: (str(v.dtype), v.shape) for k, v in saved.items()} == \
                {k: (str(v.dtype), v.shape) for k, v in single.items()}
            if name == "model.ckpt":
                for key, value in single.items():
                    np.testing.assert_allclose(saved[key].asnumpy(), value.asnumpy(), rtol=0, atol=DP_WEIGHTS_ATOL)
        assert int(saved["global_step"].asnumpy()[0]) == step


def test_each_rank_of_a_data_parallel_run_holds_only_its_range_of_the_host_states(ms, single_process_run,
                                                                                 host_dp2_launch):
    """How we know: each rank logs the fp32 elements its host holds (HostAdamW.held_elements, the
    sizes of the master tensors it keeps; each moment and the accumulators hold as many). The
    matrices' P - V elements split in two, every rank keeping the V of the RMSNorm gains whole:
    ceil((P - V) / 2) + V on rank 0, the rest on rank 1, and 16 bytes an element of GiB."""
    import re

    out, proc = host_dp2_launch
    assert proc.returncode == 0, proc.stderr[-3000:]
    weights = ms.load_checkpoint(str(single_process_run / "checkpoints" / "step_3" / "model.ckpt"))
    total = sum(v.size for v in weights.values())
    vectors = sum(v.size for v in weights.values() if len(v.shape) == 1)
    half = -(-(total - vectors) // 2)
    for rank, held in ((0, half + vectors), (1, total - half)):  # (the matrices - half) + the vectors
        log = (out.parent / "logs" / f"worker_{rank}.log").read_text()
        said = re.search(r"the optimizer on the host: \d+ thread\(s\), ([\d.]+) GiB of fp32 master weights, moments "
                         r"and gradient accumulators in host memory \(rank (\d)'s range: ([\d,]+) of ([\d,]+)\)", log)
        assert said, log[-2000:]
        assert (int(said.group(2)), int(said.group(3).replace(",", "")), int(said.group(4).replace(",", ""))) == \
            (rank, held, total)
        assert float(said.group(1)) == pytest.approx(16 * held / 2**30, abs=0.005)
        assert held < 0.51 * total


def test_a_data_parallel_host_run_resumes_on_one_card_without_offload(single_process_run, host_dp2_launch, tmp_path):
    """The launch's step 6, its states gathered from two ranks, resumed in one process without
    offload: steps 7 and 8 are the one-process run's."""
    import shutil

    from conftest import EIGHT_STEPS, read_metrics, run_cli

    out = tmp_path / "resumed"
    shutil.copytree(host_dp2_launch[0], out)
    shutil.rmtree(out / "checkpoints" / "step_8")
    run_cli("train", SMOKE, "--output-dir", out, *EIGHT_STEPS, "--set", "train.micro_batch_size=4", "--resume", "auto",
            "--force", check=True)
    got, want = read_metrics(out), read_metrics(single_process_run)
    assert [r["step"] for r in got] == list(range(1, 9))
    for a, b in zip(got[6:], want[6:]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5) and a["samples_consumed"] == b["samples_consumed"]


@pytest.mark.parametrize("ranks", [1, 2, 3, 7])
def test_the_ranks_ranges_cover_every_matrix_once_and_gather_back_whole_across_chunks(monkeypatch, ranks):
    """steps/host/shards.py without a launch: the ranks' ranges of uneven matrices (ranges
    starting and ending inside tensors, the last rank's shorter) hold every matrix element once
    and every vector on each rank, and the chunked gather that saving uses, its chunk set
    smaller than a tensor, rebuilds each matrix exactly (the launch's model is one chunk). The
    AllGather is simulated: the ranks' chunks side by side, as the collective returns them."""
    from types import SimpleNamespace

    from mindspore import Tensor

    from llama_npu.steps.host import shards as host_shards

    shapes = [(7, 3), (5,), (4, 4), (2, 9), (3,), (1, 5)]
    params = [SimpleNamespace(shape=shape) for shape in shapes]
    values = [np.arange(int(np.prod(s)), dtype=np.float32) + 100 * i for i, s in enumerate(shapes)]
    monkeypatch.setattr(host_shards, "CHUNK", 5)
    layouts = [host_shards.ShardLayout(params, rank, ranks) for rank in range(ranks)]
    held = {i: np.zeros(v.size, int) for i, v in enumerate(values)}
    for layout in layouts:
        for index, start, stop in layout.pieces:
            held[index][start:stop] += 1
    for index, count in held.items():
        assert (count == (1 if len(shapes[index]) > 1 else ranks)).all(), index
    if ranks == 1:
        return  # one card gathers nothing

    owned = [[values[index][start:stop] for index, start, stop in layout.pieces] for layout in layouts]
    sent = [np.concatenate([v for (i, _, _), v in zip(layout.pieces, mine) if i in layout.offsets])
            for layout, mine in zip(layouts, owned)]
    chunk = min(layouts[0].shard, host_shards.CHUNK)

    def simulated_gather():
        calls = []

        def gather(_):
            begin = len(calls) * chunk
            calls.append(begin)
            return Tensor(np.concatenate([np.pad(s[begin:begin + chunk], (0, chunk - s[begin:begin + chunk].size))
                                          for s in sent]))
        return gather

    for layout, mine in zip(layouts, owned):
        layout._gather = simulated_gather()
        rebuilt = {}
        layout.gather(mine, rebuilt.__setitem__)
        assert sorted(rebuilt) == layout.matrices
        for index, whole in rebuilt.items():
            np.testing.assert_array_equal(whole, values[index])


def test_a_dpo_run_with_the_optimizer_on_the_host_equals_one_without(tmp_path):
    """plan --fit recommends the optimizer on the host for the 3B full DPO recipe on 8 x 910B
    (tests/test_preference.py): the objective's loss cell, its step normaliser (pairs) and its
    metrics go through the host step as through the in-graph one. Two steps of the CPU DPO
    recipe from random weights: the same losses and rewards within 1e-5."""
    from conftest import read_metrics

    recipe = REPO / "recipes" / "cpu_dpo_smoke.yaml"
    pairs = tmp_path / "pairs.jsonl"  # the two steps' pairs: the reference pass scores no more
    pairs.write_text("".join((REPO / "data" / "zh_pref_train.jsonl").read_text(encoding="utf-8").splitlines(True)[:8]),
                     encoding="utf-8")
    runs = {}
    for name, extra in (("device", []), ("host", ["--set", HOST])):
        out = tmp_path / name
        run_cli("train", recipe, "--output-dir", out, "--set", "train.max_steps=2", "--set",
                f"data.train_files=[{pairs}]", *extra, check=True)
        runs[name] = [m for m in read_metrics(out) if "loss" in m]
    assert len(runs["host"]) == len(runs["device"]) == 2
    for host, device in zip(runs["host"], runs["device"]):
        for key in ("loss", "rewards/margins", "rewards/chosen", "logps/rejected"):
            assert host[key] == pytest.approx(device[key], rel=1e-5, abs=1e-6), key
