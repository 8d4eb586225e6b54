"""Multi-device: data parallel for real on CPU with msrun; the Ascend-only layouts checked
through the configuration they generate, the MindFormers wrapper chain they build (under
msrun, without compiling) and their validation messages."""
import json
import os
import re
import subprocess

import numpy as np
import pytest

from llama_npu.recipe.load import load_recipe
from llama_npu.recipe.problems import RecipeError
from llama_npu.strategies.parallel import (World, auto_parallel_context, check_workers, is_sharded,
                                           mindformers_parallel_config, stream_layout)

from conftest import EIGHT_STEPS, REPO, SMOKE, free_port, read_metrics, run_cli, run_launch


def weights_at_step_3(ms, run_dir):
    return {k: v.asnumpy() for k, v in ms.load_checkpoint(str(run_dir / "checkpoints" / "step_3" / "model.ckpt")).items()}


def test_data_parallel_equals_one_process_with_the_same_global_batch(ms, single_process_run, dp2_launch):
    """2 ranks x 2 samples (the session's shared launch, strategies.parallel.data: auto -> 2)
    against one process with the 4 samples. Data parallel with accumulated micro-batches is
    the launch selftest's check (test_selftest.py), which steps both forms."""
    single = single_process_run
    out, proc, logs = dp2_launch
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 worker(s), data parallel: data 2 x model 1 x pipeline 1" in proc.stdout
    digests = {line.split()[-1] for log in logs.values() for line in log.splitlines() if "weights sha256" in line}
    assert len(logs) == 2 and len(digests) == 1, "ranks must hold bit-identical weights"
    got, want = weights_at_step_3(ms, out), weights_at_step_3(ms, single)
    assert got.keys() == want.keys()
    # Adam divides each gradient element by its own running magnitude, so a different fp32
    # summation order (all-reduce vs one batch) in a near-zero element moves that weight by a
    # fraction of the learning rate, not of the gradient: allow 1% of one step's update (lr 3e-3;
    # measured here: 1.03e-5 on 1 of 2048 embedding weights with 2 x 2 micro-batches).
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=0, atol=0.01 * 3.0e-3)
    for a, b in zip(read_metrics(out), read_metrics(single)):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["samples_consumed"] == b["samples_consumed"]
    assert len(read_metrics(out)) == 8
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in single.iterdir())


@pytest.mark.quick
def test_launch_refuses_a_layout_that_does_not_fill_the_workers(tmp_path):
    proc = run_launch(SMOKE, 2, "--output-dir", tmp_path / "run", *EIGHT_STEPS, "--set", "strategies.parallel.data=1",
                      log_dir=tmp_path / "logs")
    assert proc.returncode == 2
    assert "data 1 x model 1 x pipeline 1 = 1 workers, but 2 are running" in proc.stderr


def test_launch_rehearses_a_recipe_data_parallel_over_its_cpu_workers(tmp_path):
    """scripts/launch.sh RECIPE 2 --rehearse: the 8 x 910B recipe's rehearsal over two CPU
    workers, both ranks with the same weights, and only rank 0 naming a checkpoint."""
    from llama_npu.training.rehearse import STEPS as REHEARSAL_STEPS

    out = tmp_path / "run"
    proc = run_launch(REPO / "recipes" / "llama3_2_3b_zh_full_8x910b.yaml", 2, "--rehearse", "--output-dir", out,
                      log_dir=tmp_path / "logs")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workers"] == 2 and "strategies.parallel.data 8 -> 2 (the processes it runs on)" in \
        summary["rehearsal"]["shrunk"]
    assert not any("data parallel over" in item for item in summary["rehearsal"]["not_rehearsed"])
    assert [r["step"] for r in read_metrics(out)] == list(range(1, REHEARSAL_STEPS + 1))
    digests = re.findall(r"rank \d weights sha256 (\w+)", proc.stdout)
    assert len(digests) == 2 and len(set(digests)) == 1
    assert "checkpoint     rank 0 saves it" in proc.stdout and "checkpoint     None" not in proc.stdout


def test_one_host_rehearses_two_nodes_as_docs_multi_device_writes_it(dp2_launch, tmp_path):
    """docs/multi-device.md's one-host rehearsal of two nodes: two launch.sh with MASTER_ADDR
    127.0.0.1, NODE_RANK 0 and 1, LOCAL_WORKERS=1, node 1 with its own LOG_DIR. Node 1 starts
    its worker without msrun, so without a second scheduler; 2 steps train as the session's
    two-worker launch trained its first 2."""
    reference, launched, _ = dp2_launch
    assert launched.returncode == 0, launched.stderr[-3000:]
    run, port = tmp_path / "rehearsal", str(free_port())
    nodes = []
    for n in (0, 1):  # as the docs start them: node 0 first, in the background
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "NODE_RANK": str(n), "LOCAL_WORKERS": "1",
               "MASTER_PORT": port, "LOG_DIR": str(tmp_path / f"logs{n}")}
        nodes.append(subprocess.Popen(["bash", "scripts/launch.sh", str(SMOKE), "2", "--output-dir", str(run),
                                       *EIGHT_STEPS, "--set", "train.max_steps=2"], env=env,
                                      stdout=open(tmp_path / f"node{n}.out", "w"),
                                      stderr=open(tmp_path / f"node{n}.err", "w")))
    consoles = lambda: [(tmp_path / f"node{n}.err").read_text()[-2000:] for n in (0, 1)]  # noqa: E731
    assert [proc.wait(timeout=300) for proc in nodes] == [0, 0], consoles()
    assert (tmp_path / "logs0" / "scheduler.log").exists() and not (tmp_path / "logs1" / "scheduler.log").exists()
    got, want = read_metrics(run), read_metrics(reference)[:2]
    assert [r["step"] for r in got] == [1, 2]
    for a, b in zip(got, want):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6) and a["samples_consumed"] == b["samples_consumed"]
    # Node 1's rank trained the same: its console's summary names the same weights as node 0's.
    said = [(tmp_path / f"node{n}.out").read_text() + (tmp_path / f"node{n}.err").read_text() for n in (0, 1)]
    digests = [re.findall(r"weights sha256 (\w+)", text) for text in said]
    assert digests[0] == digests[1] != [], digests


def ascend(*overrides, workers=None):
    return load_recipe(SMOKE, ["device.target=ascend", "device.name=910b", "model.preset=llama3.2-3b",
                               "data.max_seq_len=4096", "train.micro_batch_size=4", "train.global_batch_size=0",
                               *overrides], workers=workers)


def store_recipe(run, pipeline):
    """A sharded run's recipe.yaml, as train writes it, with `pipeline` stages."""
    import yaml

    stages = ([f"strategies.parallel.pipeline={pipeline}", "strategies.parallel.micro_batches=2", "data.eval_files=[]"]
              if pipeline > 1 else ["strategies.parallel.model=2"])
    run.mkdir(parents=True, exist_ok=True)
    (run / "recipe.yaml").write_text(yaml.safe_dump(ascend(*stages).to_dict()))


def test_semi_auto_configuration_for_model_and_pipeline_parallel(tmp_path):
    recipe = ascend("strategies.parallel.data=2", "strategies.parallel.model=2", "strategies.parallel.pipeline=2",
                    "strategies.parallel.micro_batches=4", "strategies.parallel.sequence_parallel=true",
                    "train.micro_batch_size=1", "train.global_batch_size=8", "data.eval_files=")
    par = recipe.strategies.parallel
    check_workers(par, 8)
    assert is_sharded(par)
    assert auto_parallel_context(par, 8, tmp_path / "s.ckpt") == {
        "parallel_mode": "semi_auto_parallel", "device_num": 8, "full_batch": True,
        "enable_parallel_optimizer": False, "strategy_ckpt_save_file": str(tmp_path / "s.ckpt"),
        "pipeline_stages": 2}
    assert mindformers_parallel_config(par) == {
        "data_parallel": 2, "model_parallel": 2, "pipeline_stage": 2, "micro_batch_num": 4,
        "use_seq_parallel": True, "vocab_emb_dp": True}
    # Every rank reads the whole step (full_batch): 1 sample x data 2 x 4 pipeline micro-batches.
    assert stream_layout(par, World(rank=3, size=8, sharded=True), 1) == (8, 0, 1)
    # MindFormers accepts it: the 3B config builds with this layout (no weights allocated).
    from llama_npu.model.architecture import resolve_shape
    from llama_npu.model.llama import llama_config

    config = llama_config(resolve_shape(recipe.model), 4096, on_ascend=True,
                          parallel_config=mindformers_parallel_config(par))
    assert (config.parallel_config.model_parallel, config.parallel_config.pipeline_stage) == (2, 2)


def test_data_parallel_configuration():
    recipe = load_recipe(SMOKE, ["strategies.parallel.data=4", "train.global_batch_size=0"])
    assert auto_parallel_context(recipe.strategies.parallel, 4, "unused") == {
        "parallel_mode": "data_parallel", "gradients_mean": False, "device_num": 4}
    assert mindformers_parallel_config(recipe.strategies.parallel) == {}


@pytest.mark.parametrize("overrides, message", [
    (["strategies.parallel.model=3"], "strategies.parallel.model=3 must divide the attention heads (24) and KV heads (8)"),
    (["strategies.parallel.pipeline=3"], "strategies.parallel.pipeline=3 must divide the layers (28)"),
    (["strategies.parallel.pipeline=4", "strategies.parallel.micro_batches=2"],
     "strategies.parallel.micro_batches=2 must be at least strategies.parallel.pipeline=4"),
    (["strategies.parallel.pipeline=2", "strategies.parallel.micro_batches=4", "train.global_batch_size=12",
      "data.eval_files="],
     "train.global_batch_size=12: with pipeline stages it must equal train.micro_batch_size=4 x strategies.parallel.data=1 x "
     "strategies.parallel.micro_batches=4 = 16"),
    (["strategies.parallel.sequence_parallel=true"], "sequence_parallel needs strategies.parallel.model > 1"),
    (["strategies.parallel.optimizer_shard=true", "train.optimizer.name=sgd"],
     "train.optimizer.name=sgd with strategies.parallel.optimizer_shard=true: MindSpore shards only AdamW's state"),
    (["strategies.parallel.model=2", "strategies.chunked_ce.enabled=true"],
     "strategies.chunked_ce.enabled=true with strategies.parallel.model=2: chunked cross-entropy has no sharded version"),
    (["strategies.parallel.optimizer_shard=true", "strategies.chunked_ce.enabled=true"],
     "strategies.chunked_ce.enabled=true with strategies.parallel.optimizer_shard=true: chunked cross-entropy"),
    (["strategies.parallel.pipeline=2", "strategies.parallel.micro_batches=2", "train.eval_every=10"],
     "train.eval_every=10 with strategies.parallel.pipeline=2: evaluation does not run through pipeline stages"),
    (["strategies.parallel.pipeline=2", "strategies.parallel.micro_batches=2", "train.eval_every=0"],
     "data.eval_files with strategies.parallel.pipeline=2: evaluation does not run through pipeline stages"),
    (["strategies.parallel.model=2", "strategies.parallel.sequence_parallel=true", "data.max_seq_len=4095"],
     "strategies.parallel.sequence_parallel splits data.max_seq_len=4095 across strategies.parallel.model=2 ranks"),
    (["strategies.parallel.data=2", "train.global_batch_size=12"],
     "train.global_batch_size=12 is not divisible by train.micro_batch_size=4 x data parallel 2 = 8"),
])
def test_layout_validation_names_the_numbers(overrides, message):
    with pytest.raises(RecipeError) as err:
        ascend(*overrides)
    assert message in str(err.value)


def test_operator_sharding_is_refused_on_cpu():
    with pytest.raises(RecipeError, match="strategies.parallel.model=2 needs device.target=ascend"):
        load_recipe(SMOKE, ["strategies.parallel.model=2"])
    with pytest.raises(RecipeError, match="optimizer_shard=true needs device.target=ascend"):
        load_recipe(SMOKE, ["strategies.parallel.optimizer_shard=true"])


@pytest.mark.quick
def test_validate_command_reports_the_layout(tmp_path):
    # its own output directory: validate judges train's default, runs/cpu_smoke, which a smoke run fills
    proc = run_cli("validate", SMOKE, "--set", "strategies.parallel.data=2", "--workers", "2", "--output-dir",
                   tmp_path / "run")
    assert proc.returncode == 0 and "2 worker(s), data parallel" in proc.stdout


@pytest.mark.quick
def test_merge_checkpoints_explains_what_it_needs(tmp_path):
    proc = run_cli("merge-checkpoints", tmp_path, "--dst", tmp_path / "m.ckpt")
    assert proc.returncode == 2 and "no checkpoints/rank_<R> directories" in proc.stderr
    for rank in (0, 1):
        (tmp_path / "checkpoints" / f"rank_{rank}" / "step_2").mkdir(parents=True)
    proc = run_cli("merge-checkpoints", tmp_path, "--dst", tmp_path / "m.ckpt")
    assert proc.returncode == 2 and "no step is complete on every rank" in proc.stderr


@pytest.mark.parametrize("workers, overrides, data", [
    (None, [], 1),  # a plain process
    (8, [], 8),
    (8, ["strategies.parallel.model=2", "strategies.parallel.pipeline=2", "strategies.parallel.micro_batches=2",
         "data.eval_files="], 2),
])
def test_data_parallel_auto_is_the_workers_left_by_model_and_pipeline(workers, overrides, data):
    recipe = ascend(*overrides, workers=workers)
    assert recipe.strategies.parallel.data == data
    check_workers(recipe.strategies.parallel, workers or 1)


def test_data_parallel_auto_refuses_workers_that_do_not_divide():
    with pytest.raises(RecipeError, match=r"strategies.parallel.data=auto: 6 workers do not divide into model 4 "
                                          r"x pipeline 1 = 4; launch a multiple of 4 workers"):
        ascend("strategies.parallel.model=4", workers=6)
    proc = run_cli("validate", SMOKE, "--workers", "3", "--set", "strategies.parallel.data=2")
    assert proc.returncode == 2 and "data 2 x model 1 x pipeline 1 = 2 workers, but 3 are running" in proc.stderr


@pytest.fixture(scope="module")
def sharded_chains(tmp_path_factory):
    """Each rank's description of the train steps it built for four sharded layouts
    (tests/sharded_chain.py), from one two-worker msrun launch."""
    out = tmp_path_factory.mktemp("chains")
    env = {**os.environ, "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([str(REPO / ".venv" / "bin" / "msrun"), "--worker_num=2", "--local_worker_num=2",
                           f"--master_port={free_port()}", f"--log_dir={out / 'logs'}", "--join=True",
                           "--cluster_time_out=60", str(REPO / "tests" / "sharded_chain.py"), str(out)],
                          cwd=out, env=env, capture_output=True, text=True, timeout=600)
    logs = "".join(p.read_text()[-3000:] for p in (out / "logs").glob("*.log"))
    assert proc.returncode == 0, logs
    return {rank: json.loads((out / f"rank_{rank}.json").read_text()) for rank in (0, 1)}, out


@pytest.mark.parametrize("layout, chain, micro_batches, clip, manager, scale, data", [
    ("model2", ["ClearingBeforeForward(MFTrainOneStepCell)", "_VirtualDatasetCell", "TrainLoss", "LlamaForCausalLM"],
     1, 0.5, None, 1024, 1),
    ("model2_accumulate4", ["ClearingBeforeForward(MFPipelineWithLossScaleCell)", "_VirtualDatasetCell",
                            "GradAccumulationCellWithTwoOutput", "TrainLoss", "LlamaForCausalLM"], 4, 1.0,
     "DynamicLossScaleUpdateCell", 4096, 1),
    ("pipeline2", ["ClearingBeforeForward(MFPipelineWithLossScaleCell)", "_VirtualDatasetCell",
                   "PipelineCellWithTwoOutput", "TrainLoss", "LlamaForCausalLM"], 4, 1.0, "DynamicLossScaleUpdateCell",
     256, 1),
    ("optimizer_shard", ["ClearingBeforeForward(MFTrainOneStepCell)", "_VirtualDatasetCell", "TrainLoss",
                         "LlamaForCausalLM"], 1, 2.0, None, 1, 2),
])
def test_sharded_layouts_train_through_mindformers_wrapper_chain(sharded_chains, layout, chain, micro_batches, clip,
                                                                  manager, scale, data):
    chains, out = sharded_chains
    for rank in (0, 1):
        built = chains[rank][layout]
        assert built["sharded"] and built["chain"] == chain
        # The wrapper and the cell that cuts the batch agree on the number of micro-batches.
        assert built["wrapper_micro_batches"] == built["cut_into"] == micro_batches
        assert built["per_token_loss"] and built["clip"] == clip
        assert (built["loss_scale_manager"], built["loss_scale"]) == (manager, scale)
        assert built["lr_schedule"] == "WarmupCosineLR"  # the wrapper evaluates our schedule in its graph
        assert built["data"] == data and built["parallel_optimizer"] == (layout == "optimizer_shard")
        assert built["strategy_file"] == str(out / "run" / "strategy" / f"rank_{rank}.ckpt")
        # selftest's sharded check (on the CPU it can only check what was built) sees the
        # layout asked and fails one that was not
        assert built["layout_problem"] == ""
        assert built["other_layout_problem"].startswith("pipeline ")
    assert chains[0]["pipeline2"]["layer_stages"] == [0, 1]
    assert chains[0]["model2"]["model_parallel"] == 2
    # Evaluation: MindFormers' loss in _VirtualDatasetCell, fed the whole data-parallel batch.
    assert chains[0]["optimizer_shard"]["eval_chain"] == ["EvalKeepingTrainStrategy", "_VirtualDatasetCell", "EvalLoss",
                                                          "LlamaForCausalLM"]
    assert chains[0]["optimizer_shard"]["eval_batch"] == 2


def test_dpo_with_optimizer_sharding_builds_the_pair_loss_into_the_chain_after_a_stand_alone_reference(
        sharded_chains):
    """train.objective dpo on data 2 x optimizer_shard (tests/sharded_chain.py dpo_layout): the
    reference pass ran for real before the chain was built, stand-alone (semi-auto parallel
    cannot compile on the CPU), and left the run's semi-auto context as it was; MindFormers'
    accumulation wrapper takes the pair loss; each micro-batch goes in with each pair's rows
    side by side (so _VirtualDatasetCell's split keeps them on one card), with their reference."""
    chains, out = sharded_chains
    for rank in (0, 1):
        built = chains[rank]["dpo_optimizer_shard"]
        assert built["chain"] == ["ClearingBeforeForward(MFPipelineWithLossScaleCell)", "_VirtualDatasetCell",
                                  "GradAccumulationCellWithTwoOutput", "PairLossTwoOutputs", "PreferenceLoss"]
        assert built["wrapper_micro_batches"] == built["cut_into"] == 2 and built["per_token_loss"]
        assert built["sharded"] and built["data"] == 2 and built["layout_problem"] == "" and built["full_batch"]
        assert built["strategy_file"] == str(out / "run_dpo" / "strategy" / f"rank_{rank}.ckpt")
        assert built["pair_split"] == "InterleavedPairs" and built["pairs_a_micro_batch"] == 2
        assert built["pair_split_strategy"] == [[2, 1]]  # the batch axis split over data parallel, a pair whole
        # The checkpointer's host collective compiles stand-alone in a sharded run (full_batch
        # off while it does, then on again): before, MindSpore refused the compile.
        assert built["ranks_summed"] == 2.0 and built["full_batch_after"]
        reference = np.array(built["reference"])
        assert reference.shape == (4, 2) and np.isfinite(reference).all() and (reference < 0).all()
        np.testing.assert_array_equal(reference, chains[0]["dpo_optimizer_shard"]["reference"])
        ends = built["row_ends"]  # 2 micro-batches of 2 pairs: 8 rows, pair i's ending with 8 + i, 42 + i
        assert len(ends) == 8 and ends[1::2] == [end + 34 for end in ends[0::2]]
        assert sorted(ends[0::2]) == [8, 9, 10, 11]
        expected = [reference[end - 8 if end < 40 else end - 42, int(end >= 40)] for end in ends]
        np.testing.assert_array_equal(built["reference_rows"], np.array(expected, np.float32))
    np.testing.assert_array_equal(chains[0]["dpo_optimizer_shard"]["stored_reference"],
                                  chains[0]["dpo_optimizer_shard"]["reference"])


def test_pipeline_wrapper_clears_before_the_forward_and_after_the_read_only(sharded_chains):
    """The wrapper of k > 1 and pipelines on the register path (the 910A's), as the k = 1 one
    (test_strategies): MindFormers' MFPipelineWithLossScaleCell reads the float status with no
    clear before it, so what ran since the last step's read (its update, an evaluation) was
    charged to the step; clearing_before_forward clears before the forward. The IR is the one
    tests/sharded_chain.py dumped under msrun (the wrapper needs a communication group)."""
    from test_strategies import assert_clears_before_the_forward_and_after_the_read_only

    _, out = sharded_chains
    for rank in (0, 1):
        (ir,) = (out / "ir" / f"rank_{rank}").glob("*_validate_*.ir")
        assert_clears_before_the_forward_and_after_the_read_only(ir)


def compiling_step(net, optimizer, loss_cell):
    """A step that compiles ahead, as the sharded step does: a real compile of the loss
    cell on CPU, remembering what the weights held at that moment; it loads as every step
    whose states are the graph's (steps/contract.py)."""
    from llama_npu.common.console import note
    from llama_npu.steps import Step

    class CompilingStep(Step):
        weights_at_compile = None

        def __call__(self, micro_batches, lr, stop_requested=False):
            raise AssertionError("a resume does not step")

        def loss_scale_state(self):
            return {}

        def load_loss_scale_state(self, state):
            pass

        def compile_before_load(self, example_batches):
            note("the test step compiles")
            loss_cell.compile(*(ms_tensor(a) for a in example_batches()[0]))
            self.weights_at_compile = net.trainable_params()[0].asnumpy().copy()

    step = CompilingStep()
    step.network, step.optimizer = net, optimizer
    return step


def ms_tensor(array):
    import mindspore as ms

    return ms.Tensor(array)


def test_resume_compiles_the_train_graph_before_loading_the_checkpoint(ms, tmp_path, capsys):
    from llama_npu.checkpoints.files import optimizer_state_params, save_checkpoint
    from llama_npu.checkpoints.policy import Checkpointer
    from llama_npu.checkpoints.resume import compile_then_load
    from llama_npu.strategies.network import build_network
    from llama_npu.strategies.parallel import World
    from llama_npu.steps.optimizer import build_optimizer

    recipe = load_recipe(SMOKE, ["data.max_seq_len=16", "train.micro_batch_size=2"])
    net, loss_cell = build_network(recipe, on_ascend=False)
    params = net.trainable_params()
    optimizer = build_optimizer(params, recipe.train)
    saved = [p.asnumpy() + 1.0 for p in params]
    for p, value in zip(params, saved):
        p.set_data(ms.Tensor(value))
    path = save_checkpoint(tmp_path / "ckpt", 3, params, optimizer_state_params(optimizer, params), {"step": 3})
    net, loss_cell = build_network(recipe, on_ascend=False)  # fresh weights
    fresh = net.trainable_params()[0].asnumpy().copy()
    optimizer = build_optimizer(net.trainable_params(), recipe.train)
    step = compiling_step(net, optimizer, loss_cell)
    ids = np.random.default_rng(0).integers(0, 1000, (2, 17)).astype(np.int32)
    checkpointer = Checkpointer(tmp_path, World(), keep_last=1)
    state = compile_then_load(step, lambda: [(ids, ids)], checkpointer, path)
    assert checkpointer.last == path and state["step"] == 3
    np.testing.assert_array_equal(step.weights_at_compile, fresh)  # compiled while the weights were unloaded
    np.testing.assert_array_equal(net.trainable_params()[0].asnumpy(), saved[0])
    out = capsys.readouterr().out
    assert out.index("the test step compiles") < out.index(f"loading checkpoint {path}")


def write_stage_strategy(path, stage, param):
    """A strategy file as a pipeline stage's one rank writes it, `param` (4 x 4) not split."""
    from llama_npu.selftest.sharded import write_strategy

    write_strategy(path, {param: [-1, -1]}, stage, devices=1)


@pytest.mark.parametrize("pipeline", [1, 2])
def test_merge_uses_the_strategy_of_every_pipeline_stage(ms, tmp_path, pipeline):
    from llama_npu.weights.merge_checkpoints import source_strategy

    run = tmp_path / "run"
    # Ranks 0 and 1 hold stage 0, ranks 2 and 3 stage 1 (without a pipeline all four hold everything).
    for rank in range(4):
        stage = rank // 2 if pipeline > 1 else 0
        write_stage_strategy(run / "strategy" / f"rank_{rank}.ckpt", stage, f"model.layers.{stage}.w")
    store_recipe(run, pipeline)
    strategy = source_strategy(run, tmp_path)
    merged = ms.train.node_strategy_pb2.ParallelStrategyMap()
    merged.ParseFromString(strategy.read_bytes())
    names = sorted(item.param_name for item in merged.parallel_layout_item)
    assert names == (["0-model.layers.0.w", "1-model.layers.1.w"] if pipeline > 1 else ["model.layers.0.w"])


SCHEDULE = ["train.warmup_steps=3", "train.max_steps=8", "train.min_lr_ratio=0.1"]


@pytest.mark.parametrize("warmup", ["train.warmup_steps=3", "train.warmup_steps=0"])
def test_sharded_lr_schedule_in_the_graph_equals_lr_at(ms, warmup):
    """The optimizer reads the schedule with global_step (0 at the first update) before it
    adds 1: the cell must give lr_at(global_step + 1), through warm-up, its last step, the
    cosine, max_steps and beyond it."""
    from llama_npu.steps.optimizer import WarmupCosineLR, lr_at

    train = load_recipe(SMOKE, [*SCHEDULE, warmup, "train.optimizer.lr=0.001"]).train
    schedule = WarmupCosineLR(train)
    for global_step in [0, 1, 2, 3, 4, 5, 7, 8, 20]:
        got = float(schedule(ms.Tensor([global_step], ms.int32)).asnumpy().item())
        assert abs(got - lr_at(global_step + 1, train)) < 1e-7, global_step


def overflow_gated_step(ms, schedule=SCHEDULE):
    """A Dense layer, SGD with the sharded layouts' schedule, and a step cell of the shape of
    MindFormers' MFTrainOneStepCell.construct (mindformers/wrapper/wrapper.py): the
    wrapper reads the LR from the schedule, then runs the optimizer only `if not overflow`."""
    from mindspore import nn, ops

    from llama_npu.steps.optimizer import build_optimizer

    class OverflowGatedStep(nn.Cell):
        def __init__(self, net, optimizer):
            super().__init__(auto_prefix=False)
            self.net, self.optimizer, self.weights = net, optimizer, optimizer.parameters
            self.grad = ops.GradOperation(get_by_list=True)

        def construct(self, x, overflow):
            loss = self.net(x).sum()
            grads = self.grad(self.net, self.weights)(x)  # of the summed output
            lr = self.optimizer.learning_rate(self.optimizer.global_step).reshape(())
            if not overflow:
                loss = ops.depend(loss, self.optimizer(grads))
            return loss, lr

    train = load_recipe(SMOKE, [*schedule, "train.optimizer.name=sgd", "train.optimizer.lr=0.1"]).train
    ms.set_seed(0)
    net = nn.Dense(4, 1, has_bias=False)
    optimizer = build_optimizer(net.trainable_params(), train, schedule_in_graph=True)
    return OverflowGatedStep(net, optimizer), net, optimizer, train


X = np.arange(8, dtype=np.float32).reshape(2, 4) / 8  # the gradient of the summed output: X.sum(0)
OVERFLOWS = [False, False, True, False, False, False, True, False]  # steps 3 and 7 are skipped


def run_gated(ms, step, overflows):
    return [float(step(ms.Tensor(X), ms.Tensor(flag)).__getitem__(1).asnumpy()) for flag in overflows]


def test_sharded_optimizer_applies_the_scheduled_lr_of_each_update_behind_an_overflow_branch(ms):
    """The learning rate changes from step to step inside the compiled graph (a host-set
    Parameter stayed at its first value there), and a skipped step does not advance the
    schedule: update u uses lr_at(u), as MindFormers' optimizers count."""
    from llama_npu.steps.optimizer import lr_at

    step, net, optimizer, train = overflow_gated_step(ms)
    weight = net.weight.asnumpy().copy()
    applied = 0
    for flag in OVERFLOWS:
        lr = run_gated(ms, step, [flag])[0]
        assert lr == pytest.approx(lr_at(applied + 1, train), abs=1e-7)  # what metrics.jsonl logs
        if not flag:
            applied += 1
            weight = weight - lr_at(applied, train) * X.sum(0)
        np.testing.assert_allclose(net.weight.asnumpy(), weight, rtol=0, atol=1e-6)
    assert int(optimizer.global_step.asnumpy().item()) == applied == 6


def test_sharded_resume_restores_the_schedules_step(ms, tmp_path):
    """optimizer.ckpt carries global_step; loaded after the graph compiled (the sharded
    resume order), the next update continues the schedule where the saved run stopped."""
    from llama_npu.checkpoints.files import load_checkpoint, optimizer_state_params, save_checkpoint

    whole, whole_net, _, _ = overflow_gated_step(ms)
    whole_lrs = run_gated(ms, whole, OVERFLOWS)

    first, net, optimizer, _ = overflow_gated_step(ms)
    first_lrs = run_gated(ms, first, OVERFLOWS[:4])
    params = net.trainable_params()
    path = save_checkpoint(tmp_path, 4, params, optimizer_state_params(optimizer, params), {})

    resumed, net, optimizer, _ = overflow_gated_step(ms)  # fresh weights, global_step 0
    resumed.compile(ms.Tensor(X), ms.Tensor(False))
    load_checkpoint(path, net, optimizer)
    assert int(optimizer.global_step.asnumpy().item()) == 3  # step 3 was skipped
    assert first_lrs + run_gated(ms, resumed, OVERFLOWS[4:]) == whole_lrs
    np.testing.assert_array_equal(net.weight.asnumpy(), whole_net.weight.asnumpy())


def test_mindformers_loss_of_the_sharded_step_equals_our_summed_token_loss(ms):
    """What CPU can run of the sharded step's loss (unsharded, stand-alone mode): MindFormers'
    Llama with calculate_per_token_loss gives our summed token loss and the target-token
    count the wrapper divides by; the eval loss gives the same sum."""
    from llama_npu.model.architecture import resolve_shape
    from llama_npu.model.llama import build_model, llama_config
    from llama_npu.model.loss import CausalLMLoss
    from llama_npu.steps.sharded_step import EvalLoss, TrainLoss

    recipe = load_recipe(SMOKE, ["data.max_seq_len=16"])
    net = build_model(llama_config(resolve_shape(recipe.model), 16, on_ascend=False, calculate_per_token_loss=True))
    net.set_train(True)
    ids = np.random.default_rng(0).integers(0, 1000, (4, 17)).astype(np.int32)
    labels = ids.copy()
    labels[:, :5] = -100  # prompt tokens carry no loss
    labels[3, 9:] = -100
    ids, labels = ms.Tensor(ids), ms.Tensor(labels)
    ours = float(CausalLMLoss(net)(ids, labels).asnumpy())
    numerator, denominator = TrainLoss(net, 1, 16)(ids, labels)
    assert numerator.asnumpy().item() == pytest.approx(ours, rel=1e-5)
    assert denominator.asnumpy().item() == pytest.approx(int((labels.asnumpy()[:, 1:] != -100).sum()), abs=1e-6)
    eval_loss = EvalLoss(net, 1)
    eval_loss.set_train(False)
    assert float(eval_loss(ids, labels).asnumpy()) == pytest.approx(ours, rel=1e-5)


def test_evaluation_leaves_the_train_graphs_strategy_file_alone(ms, tmp_path):
    """Every semi-auto graph compiled while a strategy save file is set writes it; the eval
    network switches saving off before it runs, keeping the train graph's file."""
    from llama_npu.model.architecture import resolve_shape
    from llama_npu.model.llama import build_model, llama_config
    from llama_npu.steps.sharded_step import eval_network

    recipe = load_recipe(SMOKE, ["data.max_seq_len=16"])
    net = build_model(llama_config(resolve_shape(recipe.model), 16, on_ascend=False, calculate_per_token_loss=True))
    ids = ms.Tensor(np.random.default_rng(0).integers(0, 1000, (2, 17)).astype(np.int32))
    try:
        ms.set_auto_parallel_context(strategy_ckpt_config={"save_file": str(tmp_path / "strategy" / "rank_0.ckpt")})
        evaluation = eval_network(net, 1).set_train(False)
        assert float(evaluation(ids, ids).asnumpy()) > 0
        assert ms.get_auto_parallel_context("strategy_ckpt_config")["save_file"] == ""
    finally:
        ms.reset_auto_parallel_context()


def test_merge_checkpoints_joins_the_shards_of_every_pipeline_stage(ms, tmp_path):
    """Two pipeline stages of one rank each: rank 0 owns layer 0, rank 1 layer 1, each with
    its stage's strategy file. Each rank's file also holds a stale copy of the other stage's
    layer (as every rank saved every parameter before #19): the merged checkpoint has each
    layer's value from its owning stage."""
    from llama_npu.checkpoints.files import save_checkpoint

    run = tmp_path / "run"
    store_recipe(run, pipeline=2)
    for rank in (0, 1):
        write_stage_strategy(run / "strategy" / f"rank_{rank}.ckpt", rank, f"model.layers.{rank}.w")
        both = [ms.Parameter(ms.Tensor(np.full((4, 4), rank + 1.0 if layer == rank else -1.0, np.float32)),
                             name=f"model.layers.{layer}.w") for layer in (0, 1)]
        save_checkpoint(run / "checkpoints" / f"rank_{rank}", 1, both, [], {})
    proc = run_cli("merge-checkpoints", run, "--dst", tmp_path / "merged.ckpt")
    assert proc.returncode == 0, proc.stderr
    merged = {k: v.asnumpy() for k, v in ms.load_checkpoint(str(tmp_path / "merged.ckpt")).items()}
    assert sorted(merged) == ["model.layers.0.w", "model.layers.1.w"]
    assert merged["model.layers.0.w"].mean() == 1.0 and merged["model.layers.1.w"].mean() == 2.0
    # --dst a directory: the merged weights with the config.json eval, generate and ms-to-hf read
    from llama_npu.model.architecture import resolve_shape
    from llama_npu.weights.pretrained import read_checkpoint_dir, resolve_weights

    run_cli("merge-checkpoints", run, "--dst", tmp_path / "merged", check=True)
    assert (tmp_path / "merged" / "model.ckpt").read_bytes() == (tmp_path / "merged.ckpt").read_bytes()
    shape, meta = read_checkpoint_dir(tmp_path / "merged")
    assert shape == resolve_shape(load_recipe(run / "recipe.yaml").model) and meta["dtype"] == "float32"
    assert resolve_weights(tmp_path / "merged").weights == tmp_path / "merged" / "model.ckpt"


def test_sharded_loss_keeps_packed_rows_apart_on_the_910a_path(ms):
    """The 910A (no flash attention) with a sharded layout and packed rows: the sharded
    step's loss, on what CPU can run of it (stand-alone mode, flash attention off as on the
    910A), gives each packed sample the summed loss it has alone. Before the fix the uint8
    mask was added to the scores and the samples saw each other."""
    from llama_npu.data.packing import pack
    from llama_npu.data.samples import Sample, pad_batch
    from llama_npu.model.architecture import resolve_shape
    from llama_npu.model.llama import build_model, llama_config
    from llama_npu.model.tokens import IGNORE_ID, PAD_ID
    from llama_npu.steps.sharded_step import TrainLoss

    recipe = load_recipe(SMOKE, ["data.max_seq_len=16"])
    ms.set_seed(0)
    net = build_model(llama_config(resolve_shape(recipe.model), 16, on_ascend=False, calculate_per_token_loss=True))
    assert not net.config.use_flash_attention
    net.set_train(True)
    rng = np.random.default_rng(1)
    samples = [Sample(list(ids), [IGNORE_ID] + list(ids[1:]), None)
               for ids in (rng.integers(0, 1000, 7), rng.integers(0, 1000, 9))]
    loss = TrainLoss(net, 1, 16)
    alone = [loss(*map(ms.Tensor, pad_batch([s], 17, PAD_ID))) for s in samples]
    (row,) = pack(samples, 17)
    numerator, denominator = loss(*map(ms.Tensor, pad_batch([row], 17, PAD_ID)))
    assert numerator.asnumpy().item() == pytest.approx(sum(n.asnumpy().item() for n, _ in alone), rel=1e-5)
    assert denominator.asnumpy().item() == 6 + 8
    ids, labels, _ = pad_batch([row], 17, PAD_ID)
    leaky, _ = loss(ms.Tensor(ids), ms.Tensor(labels))  # the same row without its mask
    assert abs(leaky.asnumpy().item() - numerator.asnumpy().item()) > 1e-3
