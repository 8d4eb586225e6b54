"""The memory planner: exact model-state formulas, the 3B-on-910A truth, --fit, JSON, errors,
exit codes, and the recipe --write-recipe writes."""
import json
import re
import shutil
from pathlib import Path

import pytest

from llama_npu.memory.devices import DEVICES
from llama_npu.memory.plan_report import plan_notes
from llama_npu.memory.planner import Strategy, estimate, split_params
from llama_npu.model.architecture import PRESETS
from llama_npu.model.llama import count_parameters
from llama_npu.recipe.load import load_recipe
from llama_npu.strategies.lora import lora_params_per_layer

from conftest import REPO, SMOKE, read_metrics, run_cli

P = {"llama3.2-1b": 1_235_814_400, "llama3.2-3b": 3_212_749_824}


@pytest.mark.parametrize("preset", ["llama3.2-1b", "llama3.2-3b"])
def test_parameter_split_sums_to_the_real_model(preset):
    shape = PRESETS[preset]
    split = split_params(shape)
    total = split["embedding"] + shape.num_layers * (split["layer_matrices"] + split["layer_norms"]) + split["final_norm"]
    assert total == count_parameters(shape) == P[preset]


@pytest.mark.parametrize("preset", ["llama3.2-1b", "llama3.2-3b"])
@pytest.mark.parametrize("amp, weight_bytes, copy_bytes", [("O0", 4, 0), ("O2", 4, 2), ("O3", 2, 0)])
def test_model_states_equal_the_byte_formulas(preset, amp, weight_bytes, copy_bytes):
    plan = estimate(PRESETS[preset], P[preset], DEVICES["910b"], Strategy(seq_len=512, micro_batch=1, global_batch=1,
                                                                          amp_level=amp))
    c = plan.components
    assert (c["weights"], c["weight_compute_copies"], c["gradients"], c["optimizer_states"]) == \
        (weight_bytes * P[preset], copy_bytes * P[preset], weight_bytes * P[preset], 8 * P[preset])
    assert plan.total_bytes == max(plan.phases.values()) + c["margin"] < sum(c.values())
    # One micro-batch: the gradients exist once, in the weights' dtype. Accumulating: fp32 buffers.
    accumulating = estimate(PRESETS[preset], P[preset], DEVICES["910b"],
                            Strategy(seq_len=512, micro_batch=1, global_batch=4, amp_level=amp))
    assert accumulating.components["gradients"] == 4 * P[preset]


def test_the_910a_plan_counts_the_attention_scores_flash_attention_avoids():
    shape, s = PRESETS["llama3.2-1b"], Strategy(seq_len=1024, micro_batch=2, global_batch=2)
    a, b = (estimate(shape, P["llama3.2-1b"], DEVICES[d], s) for d in ("910a", "910b"))
    assert (a.strategy.flash_attention, b.strategy.flash_attention) == (False, True)
    heads, t, tokens = shape.num_heads, 1024, 2 * 1024
    scores = 2 * heads * t * t * (4 + 2) + tokens * 2 * shape.hidden_size * 2  # fp32 probabilities + cast, k/v
    stats = 2 * heads * t * 8
    assert a.components["activations"] - b.components["activations"] == shape.num_layers * (scores - stats)


def test_optimizer_sharding_divides_the_states_by_data_parallel():
    s = Strategy(seq_len=512, micro_batch=1, global_batch=8, data=8, optimizer_shard=True)
    c = estimate(PRESETS["llama3.2-3b"], P["llama3.2-3b"], DEVICES["910b"], s).components
    assert c["optimizer_states"] == 8 * P["llama3.2-3b"] // 8 and c["gradients"] == 4 * P["llama3.2-3b"]


def test_lora_states_cover_the_adapters_only():
    shape = PRESETS["llama3.2-1b"]
    s = Strategy(seq_len=512, micro_batch=1, global_batch=1, lora=True, lora_rank=8)
    adapters = shape.num_layers * lora_params_per_layer(shape, 8, ("wq", "wk", "wv", "wo"))
    # r x (in + out) for wq, wk, wv, wo: 8 x (2048+2048 + 2048+512 + 2048+512 + 2048+2048) per layer
    assert adapters == 16 * 8 * (4096 + 2560 + 2560 + 4096)
    c = estimate(shape, P["llama3.2-1b"], DEVICES["910a"], s).components
    assert c["weights"] == 2 * P["llama3.2-1b"] + 4 * adapters  # frozen base in fp16, fp32 adapters
    assert (c["gradients"], c["optimizer_states"]) == (4 * adapters, 8 * adapters)


def test_planned_states_are_the_parameters_our_train_step_allocates(ms):
    """What the CPU can confirm: the optimizer and accumulator Parameters TrainStep creates
    have exactly the planned gradient + optimizer-state bytes. (Host RSS cannot confirm it:
    the CPU backend's first step adds compile and pool memory several times larger.)"""
    from llama_npu.model.architecture import resolve_shape
    from llama_npu.strategies.network import build_network
    from llama_npu.strategies.precision import LossScaler
    from llama_npu.steps.optimizer import build_optimizer
    from llama_npu.steps.graph_step import TrainStep

    recipe = load_recipe(SMOKE, ["data.max_seq_len=16", "train.global_batch_size=0"])
    net, cell = build_network(recipe, on_ascend=False)
    params = net.trainable_params()
    optimizer = build_optimizer(params, recipe.train)
    step = TrainStep(cell, optimizer, LossScaler(recipe.strategies.precision), 1.0, accumulation_steps=2)
    model_ids = {id(p) for p in params}
    states = sum(p.nbytes for p in optimizer.get_parameters() if id(p) not in model_ids and p.size > 1)
    accumulators = sum(p.nbytes for p in step.final.carry.gradients)
    shape = resolve_shape(recipe.model)
    plan = estimate(shape, sum(p.size for p in params), DEVICES["910b"],
                    Strategy(seq_len=16, micro_batch=2, global_batch=4, amp_level="O0"))
    assert accumulators == plan.components["gradients"]
    assert states == plan.components["optimizer_states"]
    assert sum(p.nbytes for p in params) == plan.components["weights"]


def test_3b_full_finetune_does_not_fit_one_910a_and_fit_finds_a_runnable_plan(tmp_path):
    proc = run_cli("plan", "--model", "llama3.2-3b", "--device", "910a", "--devices", "1", "--json")
    result = json.loads(proc.stdout)
    assert result["params"] == P["llama3.2-3b"] and result["fits"] is False
    assert proc.returncode == 1  # does not fit: scripts can branch on it
    assert result["components"]["optimizer_states"] == 8 * P["llama3.2-3b"]
    assert result["total_bytes"] == result["phases"][result["peak_phase"]] + result["components"]["margin"]
    assert {"weights", "gradients", "optimizer_states", "activations", "logits_loss", "margin"} <= result["components"].keys()

    out = tmp_path / "fit.yaml"
    proc = run_cli("plan", SMOKE, "--set", "model.preset=llama3.2-3b", "--set", "data.max_seq_len=2048",
                   "--set", "device.target=ascend", "--set", "device.name=910a", "--device", "910a", "--devices", "1",
                   "--fit", "--write-recipe", out, "--json")
    result = json.loads(proc.stdout)
    assert proc.returncode == 0 and result["fits"] is False
    best = result["recommended"]
    # still a full fine-tune: the optimizer moves to the host before anyone is sent to LoRA
    assert best["fits"] and best["total_bytes"] <= best["device_bytes"] and best["strategy"]["lora"] is False
    assert best["strategy"]["offload"] is True and best["components"]["optimizer_states"] == 0
    assert best["never_run_on_card"] == ["optimizer on the host"]  # named, and still recommended over LoRA
    assert best["host"]["components"]["moments"] == 8 * P["llama3.2-3b"]
    recipe = load_recipe(out)  # the written plan validates as a recipe
    assert not recipe.strategies.lora.enabled and recipe.strategies.offload.optimizer == "host"
    assert recipe.device.name == "910a" and recipe.strategies.precision.dtype == "float16"  # 910A has no BF16
    # its cost in time, in the printed plan; LoRA only when asked to keep the optimizer on the card is moot
    text = run_cli("plan", "--model", "llama3.2-3b", "--device", "910a", "--fit").stdout
    assert "offload False -> True" in text
    assert "offload costs time: the host update takes about 4.5 s a step at 20 GB/s (--host-bandwidth)" in text
    text = run_cli("plan", "--model", "llama3.2-3b", "--device", "910a", "--fit", "--host-bandwidth", "40").stdout
    assert "the host update takes about 2.2 s a step at 40 GB/s" in text


@pytest.mark.quick
def test_fit_prefers_a_layout_run_on_an_npu_to_one_never_run_there():
    """3B full fine-tuning on 8 x 910B fits with the optimizer on the host over plain data
    parallelism (each rank's host holding 1/8 of the states), which keeps it a full fine-tune
    on a layout without operator sharding: recommended. Without offload it fits only with
    optimizer sharding, never run on an NPU; LoRA over plain data parallelism fits too, and is
    preferred. With --no-lora --no-offload the sharded layout is the only one, and is
    recommended. The speed ranking puts a plan without offload first wherever one fits: the
    1B on one 910B."""
    proc = run_cli("plan", "--model", "llama3.2-3b", "--device", "910b", "--devices", "8", "--fit", "--json")
    best = json.loads(proc.stdout)["recommended"]
    assert best["fits"] and best["strategy"]["lora"] is False and best["never_run_on_npu"] == []
    assert best["strategy"]["offload"] is True and best["strategy"]["data"] == 8
    assert best["never_run_on_card"] == ["optimizer on the host"]
    proc = run_cli("plan", "--model", "llama3.2-3b", "--device", "910b", "--devices", "8", "--fit", "--no-offload",
                   "--json")
    best = json.loads(proc.stdout)["recommended"]
    assert best["fits"] and best["strategy"]["lora"] is True and best["never_run_on_npu"] == []
    proc = run_cli("plan", "--model", "llama3.2-3b", "--device", "910b", "--devices", "8", "--fit", "--no-lora",
                   "--no-offload", "--json")
    best = json.loads(proc.stdout)["recommended"]
    assert best["strategy"]["lora"] is False and best["never_run_on_npu"] == ["optimizer sharding"]
    assert best["strategy"]["offload"] is False
    proc = run_cli("plan", "--model", "llama3.2-1b", "--device", "910b", "--fit", "--maximize", "speed", "--json")
    best = json.loads(proc.stdout)["recommended"]
    assert best["strategy"]["offload"] is False and best["host"] is None


@pytest.mark.quick
def test_plan_names_the_host_optimizer_never_run_on_a_card_and_fit_keeps_the_recipe():
    """The 910A offload recipe: never_run_on_npu stays empty (its reason is semi-auto parallel,
    and it is --fit's first ranking key), never_run_on_card names the optimizer on the host,
    and the text says so on its own line with what has been proven instead. --fit keeps the
    recipe, which fits, and a recipe with the optimizer on the card names nothing."""
    recipe = REPO / "recipes" / "llama3_2_3b_zh_full_offload_910a.yaml"
    result = json.loads(run_cli("plan", recipe, "--json", check=True).stdout)
    assert (result["never_run_on_npu"], result["never_run_on_card"]) == ([], ["optimizer on the host"])
    lines = [line for line in run_cli("plan", recipe, check=True).stdout.splitlines() if "never run" in line]
    assert len(lines) == 1 and lines[0].startswith("  never run on a card: optimizer on the host (no card in CI; "
                                                   "proven instead on the CPU: a host step from the in-graph step's "
                                                   "state lands within fp32 rounding of it")
    assert lines[0].endswith("run `llama-npu selftest` (host_optimizer) on the card first")
    fit = json.loads(run_cli("plan", recipe, "--fit", "--json", check=True).stdout)
    assert fit["unchanged"] and fit["recommended"]["never_run_on_card"] == ["optimizer on the host"]
    on_card = json.loads(run_cli("plan", REPO / "recipes" / "llama3_2_1b_zh_full_910a.yaml", "--json").stdout)
    assert (on_card["strategy"]["offload"], on_card["never_run_on_card"]) == (False, [])


def test_the_host_line_divides_the_states_among_data_parallel_ranks():
    """The planner's host side under data parallel: each of N ranks holds 1/N of the master,
    moments and accumulators, and in flight its range sent to the card (fp32 and its bf16
    cast: 6 bytes an element, more than the embedding); a node of 8 cards 8 of those; each
    card moves 1/N of the traffic, and gathers the whole bf16 weights in the update phase."""
    from llama_npu.memory.plan_report import host_figures

    one, eight = (estimate(PRESETS["llama3.2-3b"], P["llama3.2-3b"], DEVICES["910b"],
                           Strategy(seq_len=2048, micro_batch=1, global_batch=4 * data, data=data, offload=True))
                  for data in (1, 8))
    h1, h8 = host_figures(one, 20.0), host_figures(eight, 20.0)
    staging = 2 * 128_256 * 3072  # the embedding in flight in bf16, whole on every rank
    assert h1["components"] == {"master_weights": 4 * P["llama3.2-3b"], "moments": 8 * P["llama3.2-3b"],
                                "accumulators": 4 * P["llama3.2-3b"], "staging": staging}
    shard = -(-P["llama3.2-3b"] // 8)
    assert h8["rank_bytes"] == 16 * shard + 6 * shard and h8["node_bytes"] == 8 * h8["rank_bytes"]
    assert h8["transfer_bytes"] == {"to_host": 4 * 2 * shard, "to_device": 2 * shard}  # k = 4 micro-batches
    assert eight.components["update_copies"] - one.components["update_copies"] >= 2 * (P["llama3.2-3b"] - 10**6)
    assert h8["update_seconds"] == pytest.approx(h1["update_seconds"] / 8, rel=1e-6)
    assert h1["transfer_bytes"] == {"to_host": 4 * 2 * P["llama3.2-3b"], "to_device": 2 * P["llama3.2-3b"]}


FULL_910A = str(REPO / "recipes" / "llama3_2_1b_zh_full_910a.yaml")  # global batch 16, micro-batch 1, one 910A


@pytest.mark.quick
def test_devices_that_break_the_layout_reach_the_fit_search():
    """--devices 8 with micro-batch 4 (4 x 8 does not divide the global batch 16): --fit
    changes the micro-batch only, and says why; on 32 devices no micro-batch divides 16, so
    the global batch changes too, named with its reason."""
    proc = run_cli("plan", FULL_910A, "--set", "train.micro_batch_size=4", "--devices", "8", "--fit")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == ("as given: on 8 devices, train.global_batch_size=16 is not divisible by "
                        "train.micro_batch_size=4 x data parallel 8 = 32; set train.global_batch_size=32, or "
                        "train.micro_batch_size=1 or train.micro_batch_size=2")
    assert lines[-1] == ("changed from the recipe: micro_batch 4 -> 2 (micro-batch 4 x data 8 = 32 does not divide "
                         "the global batch 16), data 1 -> 8")
    text = run_cli("plan", FULL_910A, "--set", "train.micro_batch_size=4", "--devices", "32", "--fit").stdout
    assert "micro-batch 1 x 1 accumulated x data 32 = global 32" in text
    assert "global_batch 16 -> 32 (no tested layout on 32 devices fits with the global batch 16" in text


@pytest.mark.quick
def test_fit_keeps_a_plan_that_fits_unless_asked_to_maximize():
    """A plan that fits comes back unchanged, and the output says so; --maximize searches
    for the largest micro-batch, the longest sequence or the fastest plan, each fitting."""
    given = json.loads(run_cli("plan", FULL_910A, "--fit", "--json", check=True).stdout)  # its own plan, as given
    assert given["fits"] and given["unchanged"] is True and given["recommended"]["strategy"] == given["strategy"]
    text = run_cli("plan", FULL_910A, "--fit", check=True).stdout.splitlines()
    assert text[-1].startswith("the plan as given fits: kept unchanged (--fit --maximize micro-batch|seq-len|speed")
    for goal, key in (("micro-batch", "micro_batch"), ("seq-len", "seq_len")):
        proc = run_cli("plan", FULL_910A, "--fit", "--maximize", goal, "--json", check=True)
        best = json.loads(proc.stdout)["recommended"]
        assert best["fits"] and best["strategy"][key] > given["strategy"][key], goal
        assert json.loads(proc.stdout)["unchanged"] is False
    proc = run_cli("plan", FULL_910A, "--maximize", "speed")
    assert proc.returncode == 2 and "--maximize: only with --fit" in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--model", "llama3.2-7b", "--device", "910a"], "--model: expected llama3.2-1b or llama3.2-3b"),
    (["--model", "llama3.2-1b", "--device", "910z"], "invalid choice: '910z'"),
    (["--model", "llama3.2-1b", "--device", "910a", "--seq-len", "200000"], "--seq-len: expected 1 to 131072"),
    ([str(REPO / "recipes" / "llama3_2_1b_zh_full_910b.yaml"), "--set", "strategies.parallel.data=1", "--devices", "3"],
     "--devices 3: the layout is data 1 x model 1 x pipeline 1 = 1"),
    ([str(REPO / "recipes" / "llama3_2_1b_zh_full_910b.yaml"), "--devices", "3"],  # data: auto -> 3
     "train.global_batch_size=32 is not divisible by train.micro_batch_size=4 x data parallel 3 = 12"),
    (["--model", "llama3.2-1b"], "--model needs --device"),
    (["--model", "llama3.2-1b", "--device", "910a", "--set", "strategies.lora.enabeld=true"],
     "unknown key 'strategies.lora.enabeld' (did you mean 'strategies.lora.enabled'?)"),
    (["--model", "llama3.2-1b", "--device", "910a", "--task", "inference", "--precision", "bf16"],
     "--precision bf16: 910a has no BF16 kernels"),
    ([str(SMOKE), "--precision", "fp16"], "--precision: only with --task inference"),
    ([str(SMOKE), "--write-recipe", "x.yaml"], "--write-recipe: only with --fit"),
    ([str(SMOKE), "--fit", "--data", "data/zh_instruct_train.jsonl"], "--data: only with --write-recipe"),
    (["--model", "llama3.2-1b", "--device", "910a", "--fit", "--write-recipe", "never.yaml"],
     "--write-recipe: the planned recipe names no training file (\"-\"); give --data FILE..."),
    ([str(REPO / "recipes" / "llama3_2_1b_zh_full_910b.yaml"), "--device", "910a"],
     "strategies.precision.dtype=bfloat16 with device.name=910a"),
    ([str(SMOKE), "--device", "910b", "--set", "strategies.parallel.model=3", "--set", "device.target=ascend",
      "--set", "device.name=910b"], "strategies.parallel.model=3 must divide the attention heads"),
])
def test_bad_plan_input_is_one_line_with_exit_2(args, message):
    proc = run_cli("plan", *args)
    assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1]
    assert not (REPO / "never.yaml").exists() and not (REPO / "x.yaml").exists()


def test_a_recipe_is_planned_on_its_own_device_and_layout():
    path = REPO / "recipes" / "llama3_2_3b_zh_full_8x910b.yaml"
    own = json.loads(run_cli("plan", path, "--json", check=True).stdout)
    # GB is MindSpore's 2^30 bytes (was 10**9): max_device_memory "58GB" is 58 x 2^30 to MindSpore
    assert (own["device"], own["devices"], own["device_bytes"]) == ("910b", 8, 58 * 2**30)
    assert own["strategy"]["optimizer_shard"] and own["never_run_on_npu"] == ["optimizer sharding"]
    assert json.loads(run_cli("plan", path, "--device", "910b", "--devices", "8", "--json", check=True).stdout) == own
    # device.max_device_memory is the usable memory; --device-memory and another --device override it
    smaller = json.loads(run_cli("plan", path, "--set", "device.max_device_memory=40GB", "--json").stdout)
    assert smaller["device_bytes"] == 40 * 2**30 and smaller["fits"] is False
    assert json.loads(run_cli("plan", path, "--device-memory", "61GB", "--json", check=True).stdout)[
        "device_bytes"] == 61 * 2**30
    on_b4 = run_cli("plan", path, "--device", "910b4")
    assert on_b4.returncode == 1 and "on 910b4 x 8" in on_b4.stdout and "fits: no" in on_b4.stdout


def test_set_applies_to_the_default_recipe_of_a_model():
    model = ["plan", "--model", "llama3.2-1b", "--device", "910b", "--json"]
    plain = json.loads(run_cli(*model, check=True).stdout)
    lora = json.loads(run_cli(*model, "--set", "strategies.lora.enabled=true", "--set", "data.max_seq_len=1024",
                              check=True).stdout)
    assert (plain["strategy"]["lora"], lora["strategy"]["lora"], lora["strategy"]["seq_len"]) == (False, True, 1024)
    assert lora["components"]["optimizer_states"] < plain["components"]["optimizer_states"] / 100


def test_a_plan_that_does_not_fit_exits_1_in_text_and_json():
    text = run_cli("plan", "--model", "llama3.2-3b", "--device", "910a")
    # 43.24 (was 48.35): GB is MindSpore's 2^30 bytes, and the pool 29 x 2^30 bytes
    assert text.returncode == 1 and "fits: no, 43.24 GiB over the 29.00 GiB usable" in text.stdout
    as_json = run_cli("plan", "--model", "llama3.2-3b", "--device", "910a", "--json")
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["fits"] is False
    nothing = run_cli("plan", "--model", "llama3.2-3b", "--device", "910a", "--fit", "--no-lora", "--no-offload")
    assert nothing.returncode == 1 and "nothing fits on 1 x 910a" in nothing.stdout
    # SGD: no optimizer on the host to fall back on (strategies/offload.py runs AdamW only)
    lora = run_cli("plan", "--model", "llama3.2-3b", "--device", "910a", "--fit", "--set", "train.optimizer.name=sgd")
    # flash attention is the device's, not a change to recommend (the 910A has none)
    assert lora.returncode == 0 and "changed from the recipe: lora False -> True, recompute none -> selective\n" \
        in lora.stdout
    offload = run_cli("plan", "--model", "llama3.2-3b", "--device", "910a", "--fit")  # AdamW: offload first
    assert offload.returncode == 0 and "changed from the recipe: recompute none -> selective, offload False -> True\n" \
        in offload.stdout
    assert run_cli("plan", "--model", "llama3.2-1b", "--device", "910b").returncode == 0


def test_fit_prints_one_table_and_marks_a_layout_never_run_on_an_npu(tmp_path):
    out = tmp_path / "sharded.yaml"
    proc = run_cli("plan", "--model", "llama3.2-3b", "--device", "910b", "--devices", "8", "--fit", "--no-lora",
                   "--no-offload", "--write-recipe", out, "--data", "data/zh_instruct_train.jsonl", check=True)
    assert proc.stdout.count("  component ") == 1 and proc.stdout.startswith("as given: ")
    assert "never run on an NPU: optimizer sharding" in proc.stdout
    assert "changed from the recipe: optimizer_shard False -> True" in proc.stdout
    header = out.read_text().splitlines()[:2]
    assert header[0].startswith("# Written by llama-npu plan --fit for 8 x 910b")
    assert header[1].startswith("# Layout never run on an NPU: optimizer sharding")
    recipe = load_recipe(out)
    # absolute, as --write-recipe writes every path: a two-node launch reads it from any directory
    assert recipe.strategies.parallel.optimizer_shard and \
        recipe.data.train_files == [str(Path("data/zh_instruct_train.jsonl").resolve())]
    # an existing file is kept without --overwrite, replaced with it
    out.write_text("mine\n")
    proc = run_cli("plan", "--model", "llama3.2-3b", "--device", "910b", "--devices", "8", "--fit", "--no-lora",
                   "--no-offload", "--write-recipe", out, "--data", "data/zh_instruct_train.jsonl")
    assert proc.returncode == 2 and "pass --overwrite" in proc.stderr and out.read_text() == "mine\n"
    proc = run_cli("plan", "--model", "llama3.2-3b", "--device", "910b", "--devices", "8", "--fit", "--no-lora",
                   "--no-offload", "--write-recipe", out, "--data", "data/zh_instruct_train.jsonl", "--overwrite",
                   "--json", check=True)
    result = json.loads(proc.stdout)
    assert result["written_recipe"] == str(out) and result["recommended"]["never_run_on_npu"] == ["optimizer sharding"]
    assert load_recipe(out).strategies.parallel.data == 8


def test_the_written_recipe_trains_as_written_when_shrunk(tmp_path):
    """--model with --set and --data: the written recipe names the data, keeps the --set, and
    trains as its rehearsal on CPU (`train --rehearse`)."""
    from llama_npu.training.rehearse import SEQ_LEN, STEPS

    out = tmp_path / "fit.yaml"
    proc = run_cli("plan", "--model", "llama3.2-1b", "--device", "910a", "--set", "data.pack=true", "--fit",
                   "--write-recipe", out, "--data", "data/zh_instruct_train.jsonl", check=True)
    assert "never run on an NPU" not in proc.stdout
    assert not out.read_text().splitlines()[1].startswith("#")  # no mark on a single-device layout
    recipe = load_recipe(out)
    assert recipe.data.pack and recipe.data.train_files == [str(REPO / "data" / "zh_instruct_train.jsonl")]  # absolute
    assert (recipe.device.name, recipe.strategies.precision.dtype) == ("910a", "float16")
    run_dir = tmp_path / "run"
    train = run_cli("train", out, "--rehearse", "--output-dir", run_dir, check=True)
    assert [r["step"] for r in read_metrics(run_dir)] == list(range(1, STEPS + 1))
    assert re.search(rf"packed into \d+ rows of {SEQ_LEN + 1} tokens \(\d+\.\d% padding\)", train.stdout)


CHAT = {"conversations": [{"from": "human", "value": "长城有多长？"}, {"from": "gpt", "value": "两万多公里。"}]}
ALPACA = {"instruction": "长城有多长？", "output": "两万多公里。"}


@pytest.mark.parametrize("fmt, suffix", [("alpaca", ".jsonl"), ("alpaca", ".json"), ("sharegpt", ".jsonl"),
                                         ("sharegpt", ".json")])
def test_the_written_recipe_reads_the_data_in_its_format_with_the_plans_batch(tmp_path, fmt, suffix):
    """--data's format is detected from its records (.jsonl or a .json array), --eval-data
    becomes data.eval_files, the batch is the recommended plan's, and the recipe validates
    as its rehearsal; the ShareGPT array also trains as one."""
    from llama_npu.training.rehearse import STEPS

    records = [CHAT if fmt == "sharegpt" else ALPACA] * 8
    data = tmp_path / f"train{suffix}"
    data.write_text(json.dumps(records, ensure_ascii=False, indent=2) if suffix == ".json" else
                    "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    out = tmp_path / "fit.yaml"
    proc = run_cli("plan", "--model", "llama3.2-3b", "--device", "910b", "--devices", "8", "--fit", "--no-lora",
                   "--no-offload", "--json", "--write-recipe", out, "--data", data, "--eval-data", data, check=True)
    planned = json.loads(proc.stdout)["recommended"]["strategy"]
    recipe = load_recipe(out, workers=8)
    assert (recipe.data.format, recipe.data.train_files, recipe.data.eval_files) == (fmt, [str(data)], [str(data)])
    assert (recipe.train.micro_batch_size, recipe.train.global_batch_size) == (planned["micro_batch"],
                                                                               planned["global_batch"])
    run_cli("validate", out, "--rehearse", "--output-dir", tmp_path / "run", check=True)
    if (fmt, suffix) == ("sharegpt", ".json"):
        run_cli("train", out, "--rehearse", "--output-dir", tmp_path / "run", check=True)
        assert [r["step"] for r in read_metrics(tmp_path / "run")] == list(range(1, STEPS + 1))


def test_data_auto_is_resolved_from_devices():
    path = REPO / "recipes" / "llama3_2_3b_zh_full_8x910b.yaml"
    eight = json.loads(run_cli("plan", path, "--set", "strategies.parallel.data=auto", "--devices", "8", "--json",
                               check=True).stdout)
    assert (eight["devices"], eight["strategy"]["data"]) == (8, 8)
    one = json.loads(run_cli("plan", path, "--set", "strategies.parallel.data=auto", "--set",
                             "strategies.parallel.optimizer_shard=false", "--json").stdout)
    assert (one["devices"], one["strategy"]["data"]) == (1, 1)


def test_inference_plan_counts_weights_by_precision_and_the_kv_cache():
    import subprocess
    import sys

    results = {}
    for precision in ("fp32", "fp16", "int8"):
        proc = run_cli("plan", "--model", "llama3.2-1b", "--device", "910a", "--task", "inference",
                       "--precision", precision, "--seq-len", "512", "--json", check=True)
        results[precision] = json.loads(proc.stdout)["components"]
    assert results["fp32"]["weights"] == 4 * P["llama3.2-1b"] and results["fp16"]["weights"] == 2 * P["llama3.2-1b"]
    shape = PRESETS["llama3.2-1b"]
    # int8 linear weights + one fp32 scale per output channel; embedding and norms in fp16
    split = split_params(shape)
    out_channels = 3 * 2048 + 2 * 512 + 2 * 8192
    assert results["int8"]["weights"] == 16 * (split["layer_matrices"] + 4 * out_channels) + \
        2 * (split["embedding"] + 16 * split["layer_norms"] + split["final_norm"])
    assert results["fp16"]["kv_cache"] == 2 * 16 * 512 * 512 * 2  # K and V, 16 layers, 512 tokens, 8 x 64, fp16
    # held in int8, a weight is dequantized 2^21 weights at a time on the 910A (1,024 of the MLP's 8,192 rows
    # of 2,048), and w1 and w3, which read one input, may form their first blocks at once: two fp16 blocks and
    # one block's fp32 cast and fp32 product with the scales (memory/int8_weights.py TOGETHER); the 910B's
    # WeightQuantBatchMatmul forms none
    assert (results["int8"]["dequantized_weight"], results["fp16"]["dequantized_weight"]) == \
        ((2 * 2 + 8) * 1024 * 2048, 0)
    from llama_npu.memory.planner import estimate_inference

    on_910b = estimate_inference(PRESETS["llama3.2-1b"], P["llama3.2-1b"], DEVICES["910b"], "int8", 1, 512)
    assert on_910b.components["dequantized_weight"] == 0
    # docs/memory.md and its Chinese version are generated from these formulas and current
    check = subprocess.run([sys.executable, "scripts/memory_tables.py", "--check"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


@pytest.mark.parametrize("global_batch, data, update_copies", [
    # the 910A's GE multiplies out of place: a new fp32 set of gradients (the worst case)
    (1, 1, 4 * P["llama3.2-1b"]),
    (4, 1, 4 * P["llama3.2-1b"]),
    # and the all-reduce output, one bucket (here the embedding's) at a time
    (8, 8, 128256 * 2048 * 4 + 4 * P["llama3.2-1b"]),
])
def test_the_plan_is_the_peak_over_the_step_phases(global_batch, data, update_copies):
    """docs/memory.md's table: the accumulators (k > 1) are alive in every phase, the
    gradients of k = 1 only from the backward on; the half-precision weight copies and the
    activations not in the update; at the backward's start chunked CE's three copies of the
    head's gradient; at its end a whole micro-batch's gradients (k > 1: beside the
    accumulators, the worst case) and the embedding's rows sum. HCCL's buffers in no phase:
    they are outside the pool."""
    s = Strategy(seq_len=2048, micro_batch=1, global_batch=global_batch, data=data, recompute="full",
                 chunked_ce=True, chunk_size=512)
    plan = estimate(PRESETS["llama3.2-1b"], P["llama3.2-1b"], DEVICES["910a"], s)
    c, k = plan.components, s.accumulation
    assert c["update_copies"] == update_copies and c["embedding_gradient"] == 128256 * 2048 * 4
    assert c["micro_batch_gradients"] == (4 * P["llama3.2-1b"] if k > 1 else 0)  # fp32 gradients under O2
    always = c["weights"] + c["optimizer_states"] + (c["gradients"] if k > 1 else 0)
    forward = always + c["weight_compute_copies"] + c["activations"] + c["logits_loss"]
    assert plan.phases == {
        "forward": forward,
        "backward": max(forward + 3 * c["embedding_gradient"], always + c["weight_compute_copies"]
                        + (c["micro_batch_gradients"] if k > 1 else c["gradients"]) + c["embedding_gradient"]),
        "update": always + (0 if k > 1 else c["gradients"]) + c["update_copies"]}
    # Full recompute and chunked CE leave the k = 1 backward small: there the 910A's new set of
    # gradients beside the gradients makes the update the peak.
    peak = "update" if k == 1 else "backward"
    assert plan.peak_phase == peak and plan.total_bytes == plan.phases[peak] + c["margin"]


def test_the_pool_is_max_device_memory_in_mindspores_gb():
    """MindSpore reads "29GB" as 29 x 2^30 bytes (mindspore/runtime/memory.py; AscendMemAdapter)."""
    default = json.loads(run_cli("plan", "--model", "llama3.2-1b", "--device", "910a", "--json").stdout)
    given = json.loads(run_cli("plan", "--model", "llama3.2-1b", "--device", "910a", "--device-memory", "29GB",
                               "--json").stdout)
    assert default["device_bytes"] == given["device_bytes"] == 31_138_512_896
    assert default["hbm_bytes"] == 32 * 2**30


def test_hccl_buffers_are_outside_the_pool():
    """2 x 200 MB per communicator (CANN's HCCL_BUFFSIZE default), in the HBM the pool leaves."""
    path = REPO / "recipes" / "llama3_2_1b_zh_full_8x910a_dp.yaml"
    plan = json.loads(run_cli("plan", path, "--json", check=True).stdout)
    c = plan["components"]
    assert c["communication_buffers"] == plan["outside_pool_bytes"] == 2 * 200 * 2**20
    assert plan["phases"]["forward"] == c["weights"] + c["optimizer_states"] + c["gradients"] \
        + c["weight_compute_copies"] + c["activations"] + c["logits_loss"]
    # A pool that fits but leaves HCCL too little HBM (0.20 GB of 32) does not fit.
    tight = run_cli("plan", path, "--device-memory", "31.8GB")
    assert tight.returncode == 1 and "fits: no, the communication buffers need 0.39 GiB outside the pool, where " \
        "0.20 GiB are left" in tight.stdout


def test_accumulation_is_planned_at_its_worst_case_in_plan_json():
    """k > 1: a whole micro-batch's gradients beside the accumulators before they are added in,
    since MindSpore's execution order does not guarantee better (docs/memory.md)."""
    path = REPO / "recipes" / "llama3_2_1b_zh_full_910a.yaml"
    plan = json.loads(run_cli("plan", path, "--json", check=True).stdout)
    c = plan["components"]
    assert c["micro_batch_gradients"] == c["gradients"] == 4 * P["llama3.2-1b"]
    assert plan["peak_phase"] == "backward" and plan["phases"]["backward"] == c["weights"] + c["optimizer_states"] \
        + c["gradients"] + c["weight_compute_copies"] + c["micro_batch_gradients"] + c["embedding_gradient"]
    assert any(note.startswith("micro_batch_gradients: counted at the worst case") for note in plan["notes"])
    one = json.loads(run_cli("plan", path, "--set", "train.global_batch_size=1", "--json", check=True).stdout)
    assert one["components"]["micro_batch_gradients"] == 0
    assert not any(note.startswith("micro_batch_gradients") for note in one["notes"])


@pytest.mark.parametrize("amp_level, optimizer, device, copies", [
    ("O2", "adamw", "910b", lambda gradients, embedding: 0),  # jit level O0: in place
    ("O2", "adamw", "910a", lambda gradients, embedding: gradients),  # GE (O2): a new fp32 set
    # O3's fp16 gradients, multiplied in fp32 one at a time: a new fp16 set and the
    # embedding's fp32 cast and product in flight
    ("O3", "sgd", "910b", lambda gradients, embedding: gradients + 8 * embedding),
    ("O3", "sgd", "910a", lambda gradients, embedding: gradients + 8 * embedding),
])
def test_the_update_counts_the_scaling_copies_the_step_makes(amp_level, optimizer, device, copies):
    """steps/graph_step.py multiplies fp32 gradients in place only where it compiles kernel by
    kernel; on the 910A (GE) and for O3's half gradients the products are new tensors."""
    s = Strategy(seq_len=512, micro_batch=1, global_batch=1, amp_level=amp_level, optimizer=optimizer)
    plan = estimate(PRESETS["llama3.2-1b"], P["llama3.2-1b"], DEVICES[device], s)
    c = plan.components
    assert c["gradients"] == P["llama3.2-1b"] * (2 if amp_level == "O3" else 4)
    assert c["update_copies"] == copies(c["gradients"], 128256 * 2048)
    assert plan.phases["update"] == c["weights"] + c["optimizer_states"] + c["gradients"] + c["update_copies"]
    notes = plan_notes(plan)
    assert any(n.startswith("update_copies: counted at the worst case") for n in notes) == (device == "910a")


def test_sharded_accumulation_counts_mindformers_out_of_place_scaling():
    """MFPipelineWithLossScaleCell scales the accumulators into a new set (mindformers/wrapper/wrapper.py)."""
    s = Strategy(seq_len=2048, micro_batch=1, global_batch=64, data=8, optimizer_shard=True)
    c = estimate(PRESETS["llama3.2-3b"], P["llama3.2-3b"], DEVICES["910b"], s).components
    assert c["update_copies"] == c["gradients"] == 4 * P["llama3.2-3b"]


# ---------------------------------------------------------------- INT8: LoRA over an int8 base, inference --fit

def test_int8_lora_base_is_a_byte_a_weight_plus_fp32_scales_and_the_weights_dequantized_at_once():
    """strategies.lora.base_dtype=int8: the base's linear weights at 1 byte plus one fp32 scale per
    output channel (weights/quantize.py's scales), the embedding and norms in fp16, and the
    linear weights the 910A may hold dequantized at once (memory/int8_weights.py)."""
    path = REPO / "recipes" / "llama3_2_3b_zh_lora_910a.yaml"
    plans = {dtype: json.loads(run_cli("plan", path, "--set", f"strategies.lora.base_dtype={dtype}", "--json",
                                       check=True).stdout) for dtype in ("compute", "int8")}
    shape, split = PRESETS["llama3.2-3b"], split_params(PRESETS["llama3.2-3b"])
    out_channels = 3 * 3072 + 2 * 1024 + 2 * 8192
    rest = split["embedding"] + 28 * split["layer_norms"] + split["final_norm"]
    adapters = 28 * lora_params_per_layer(shape, 16, ("wq", "wk", "wv", "wo", "w1", "w2", "w3"))
    c, c16 = plans["int8"]["components"], plans["compute"]["components"]
    assert c["weights"] == 28 * (split["layer_matrices"] + 4 * out_channels) + 2 * rest + 4 * adapters
    assert c16["weights"] == 2 * P["llama3.2-3b"] + 4 * adapters and "dequantized_weight" not in c16
    # w1's and w3's bprops, whose douts arrive together, in fp16 at once, one of them still
    # forming in fp32 (the cast of q and the product by the scales)
    assert c["dequantized_weight"] == 2 * 2 * 3072 * 8192 + (4 + 4) * 3072 * 8192
    assert plans["int8"]["strategy"]["lora_base_dtype"] == "int8"
    for phase in ("forward", "backward"):  # the same tensors otherwise
        assert plans["int8"]["phases"][phase] - plans["compute"]["phases"][phase] == \
            c["weights"] - c16["weights"] + c["dequantized_weight"]
    from llama_npu.memory.plan_report import finetune_kind

    assert finetune_kind(Strategy(seq_len=1, micro_batch=1, global_batch=1, lora=True, lora_rank=16,
                                  lora_base_dtype="int8")) == "LoRA rank 16 over an int8 base"


@pytest.mark.parametrize("reference", ["adapters_off", "precomputed"])
def test_dpo_over_an_int8_base_counts_the_dequantized_group_not_the_whole_base(reference):
    """DPO over the 3B's int8 base on a 910A: no dequantized chain is shared between the
    adapters-off reference forward and the policy's, or a forward and a backward (the IR
    test in tests/test_int8.py), so each phase holds the worst group of weights dequantized
    at once (w1's and w3's bprops: 0.28 GB), not the whole dequantized base CSE kept alive
    between the two forwards (5.6 GB in fp16), and the reference phase no more than that."""
    from dataclasses import replace

    from llama_npu.memory.planner import strategy_from_recipe

    recipe = load_recipe(REPO / "recipes" / "llama3_2_3b_zh_lora_int8_910a.yaml",
                         ["train.objective=dpo", f"dpo.reference={reference}", "data.max_seq_len=1024",
                          "data.pack=false", "data.eval_files=[]", "data.train_files=[data/zh_pref_train.jsonl]",
                          "train.micro_batch_size=1"])
    shape = PRESETS["llama3.2-3b"]
    s = strategy_from_recipe(recipe, "910a")
    plan, float_base = (estimate(shape, P["llama3.2-3b"], DEVICES["910a"], replace(s, lora_base_dtype=dtype))
                        for dtype in ("int8", "compute"))
    c = plan.components
    assert c["dequantized_weight"] == 2 * 2 * 3072 * 8192 + 8 * 3072 * 8192  # 0.28 GB, where the base is 5.6 in fp16
    for phase in float_base.phases:  # the float base's phases, its weights swapped for the int8 ones
        assert plan.phases[phase] - float_base.phases[phase] == c["weights"] - float_base.components["weights"] + (
            0 if phase == "update" else c["dequantized_weight"]), phase
    assert ("reference" in plan.phases) == (reference == "adapters_off")


def test_fit_takes_an_int8_base_only_when_no_float_base_fits(tmp_path):
    """7 GB: the 3B model's fp16 base (6 GB) leaves too little; its int8 base fits, and the
    written recipe says so. With the card's 29 GB, --fit keeps the float base."""
    out = tmp_path / "int8.yaml"
    proc = run_cli("plan", "--model", "llama3.2-3b", "--device", "910a", "--device-memory", "7GB", "--seq-len", "512",
                   "--fit", "--json", "--write-recipe", out, "--data", REPO / "data" / "zh_instruct_train.jsonl")
    best = json.loads(proc.stdout)["recommended"]
    assert proc.returncode == 0 and best["fits"] and best["total_bytes"] <= 7 * 2**30
    assert best["strategy"]["lora"] is True and best["strategy"]["lora_base_dtype"] == "int8"
    assert load_recipe(out).strategies.lora.base_dtype == "int8"
    from llama_npu.memory.fit_choice import search

    roomy, _ = search(PRESETS["llama3.2-3b"], P["llama3.2-3b"], DEVICES["910a"],
                      Strategy(seq_len=512, micro_batch=1, global_batch=1), 1, True, None, allow_offload=False)
    assert roomy.strategy.lora and roomy.strategy.lora_base_dtype == "compute"
    proc = run_cli("plan", "--model", "llama3.2-3b", "--device", "910a", "--device-memory", "7GB", "--seq-len", "512",
                   "--fit", "--no-lora", "--json")
    assert proc.returncode == 1 and json.loads(proc.stdout)["recommended"] is None


def test_inference_fit_falls_back_to_int8_and_exits_1_when_nothing_fits():
    base = ["plan", "--model", "llama3.2-3b", "--device", "910a", "--task", "inference", "--seq-len", "512", "--fit"]
    from llama_npu.memory.planner import fit_inference

    (precision, roomy), _ = fit_inference(PRESETS["llama3.2-3b"], P["llama3.2-3b"], DEVICES["910a"], "fp16", 1, 512)
    assert precision == "fp16" and roomy.fits
    tight = run_cli(*base, "--device-memory", "6GB", "--json")
    result = json.loads(tight.stdout)
    assert tight.returncode == 0 and result["fits"] is False and result["recommended"]["precision"] == "int8"
    c = result["recommended"]["components"]
    assert result["recommended"]["total_bytes"] == sum(c.values()) <= 6 * 2**30
    # the 910A's first blocks of wq, wk and wv, which read one input, in fp16 at once, one still
    # forming in fp32: 682 rows of 3,072 each (2^21 weights at most)
    assert c["dequantized_weight"] == 3 * 2 * 682 * 3072 + (4 + 4) * 682 * 3072
    none = run_cli(*base, "--device-memory", "3GB")
    assert none.returncode == 1 and "no precision fits on 910a; the closest, int8, needs" in none.stdout
    wrong = run_cli(*base, "--no-lora")
    assert wrong.returncode == 2 and "--no-lora: only with --task train" in wrong.stderr


def test_a_written_recipe_has_absolute_paths_and_steps_its_data_bears(tmp_path):
    """plan --fit --write-recipe for 50 records: --data and --eval-data given relative are
    both written absolute (a second node reads them from anywhere), and the 1B recipe's
    max_steps 1000 is lowered to what validate takes without its many-passes warning."""
    import yaml

    (tmp_path / "fifty.jsonl").write_text("".join(
        (REPO / "data" / "zh_instruct_train.jsonl").read_text(encoding="utf-8").splitlines(True)[:50]), encoding="utf-8")
    shutil.copy(REPO / "data" / "zh_instruct_eval.jsonl", tmp_path / "held_out.jsonl")
    proc = run_cli("plan", REPO / "recipes" / "llama3_2_1b_zh_full_910b.yaml", "--fit", "--write-recipe", "out.yaml",
                   "--data", "fifty.jsonl", "--eval-data", "held_out.jsonl", cwd=tmp_path, check=True)
    assert "max_steps 1000 -> 2 (4 training rows, 32 a step: at most 20 passes)" in proc.stdout.splitlines()[-1]
    written = yaml.safe_load((tmp_path / "out.yaml").read_text(encoding="utf-8"))
    # the schedule shrinks with the run: warm-up the same share, evaluation within it
    assert (written["train"]["warmup_steps"], written["train"]["eval_every"]) == (1, 2)
    assert "warmup_steps 50 -> 1 (the same share of the run)" in proc.stdout.splitlines()[-1]
    assert (written["data"]["train_files"], written["data"]["eval_files"]) == (
        [str(tmp_path / "fifty.jsonl")], [str(tmp_path / "held_out.jsonl")])
    checked = run_cli("validate", tmp_path / "out.yaml", "--rehearse", "--output-dir", tmp_path / "run")
    assert checked.returncode == 0 and "passes" not in checked.stderr, checked.stderr


def test_peak_tflops_and_mfu_set_the_compute_as_the_formula_says():
    """1B on a 910B4 (no sourced peak): unknown until --peak-tflops; then the compute is
    (6 x parameters + 12 x layers x hidden x sequence) x tokens over peak x MFU, and --mfu
    scales it. --mfu above 1 is refused."""
    args = ("plan", "--model", "llama3.2-1b", "--device", "910b4", "--json")
    unknown = json.loads(run_cli(*args).stdout)["step_time"]
    assert unknown["total_seconds"] is None and unknown["peak_tflops"] is None
    assert "910B4's is neither published nor derived" in unknown["peak_source"]
    shape, tokens = PRESETS["llama3.2-1b"], 2048  # --model: micro-batch 1 of 2,048 tokens, no recompute
    flops = (6 * P["llama3.2-1b"] + 12 * shape.num_layers * shape.hidden_size * 2048) * tokens
    for peak, mfu in ((300, None), (300, 0.5), (150, 0.5)):
        time = json.loads(run_cli(*args, "--peak-tflops", str(peak), *(["--mfu", str(mfu)] if mfu else [])).stdout)[
            "step_time"]
        assert time["peak_source"] == "--peak-tflops" and time["mfu"] == (mfu or 0.19)
        assert time["total_seconds"] == pytest.approx(flops / (peak * 1e12 * (mfu or 0.19)), rel=1e-9)
    proc = run_cli(*args, "--mfu", "1.5")
    assert proc.returncode == 2
    assert "--mfu: expected a fraction of the peak above 0 and at most 1, got 1.5" in proc.stderr


OFFLOAD_910A = str(REPO / "recipes" / "llama3_2_3b_zh_full_offload_910a.yaml")


def test_the_host_passes_are_counted_a_micro_batch_and_a_step_at_the_host_bandwidth():
    """The offload recipe's host work, from what host_step.py runs: per micro-batch 10 bytes a
    parameter (the fp16 gradient read, the fp32 accumulator read and written), per step 44 (the
    norm, the unscale, the AdamW update's 28, the zeroing) and 6 for the fp16 cast pushed back,
    at --host-bandwidth; the gradients and weights over PCIe at 25 GB/s; the overlapped step
    saves (k - 1) x the shorter of a micro-batch's card time and its accumulation."""
    from llama_npu.strategies.accumulation import accumulation_steps

    k, params = accumulation_steps(load_recipe(OFFLOAD_910A)), P["llama3.2-3b"]
    for bandwidth in (20, 40):
        time = json.loads(run_cli("plan", OFFLOAD_910A, "--host-bandwidth", str(bandwidth), "--json",
                                  check=True).stdout)["step_time"]
        details = time["details"]
        assert {name: details[name]["bytes"] for name in ("host_accumulate", "host_step_end", "host_push")} == \
            {"host_accumulate": k * 10 * params, "host_step_end": 44 * params, "host_push": 6 * params}
        for name in ("host_accumulate", "host_step_end", "host_push"):
            assert time["parts"][name] == pytest.approx(details[name]["bytes"] / (bandwidth * 1e9))
        assert details["pcie_gradients_to_host"]["bytes"] == k * 2 * params
        assert time["parts"]["pcie_weights_to_card"] == pytest.approx(2 * params / 25e9)
        card = sum(v for name, v in time["parts"].items() if not name.startswith("host_")
                   and name != "pcie_weights_to_card") / k
        prize = (k - 1) * min(card, time["parts"]["host_accumulate"] / k)
        assert time["prize_seconds"] == pytest.approx(prize) and prize > 0
        assert time["overlapped_seconds"] == pytest.approx(time["total_seconds"] - prize)


def test_maximize_speed_takes_fewer_micro_batches_with_the_optimizer_on_the_host():
    """The offload recipe at micro-batch 1 x 8 accumulated: --fit --maximize speed keeps the
    global batch of 8 and the optimizer on the host, and takes fewer, larger micro-batches
    (fewer host passes), with a shorter predicted step than the 1 x 8 plan's."""
    given = json.loads(run_cli("plan", OFFLOAD_910A, "--set", "train.micro_batch_size=1", "--fit", "--maximize",
                               "speed", "--json", check=True).stdout)
    best = given["recommended"]["strategy"]
    assert given["strategy"]["micro_batch"] == 1 and best["micro_batch"] > 1 and best["offload"] is True
    assert best["global_batch"] == 8 and given["recommended"]["fits"]
    assert given["recommended"]["step_time"]["total_seconds"] < given["step_time"]["total_seconds"]


# ---------------------------------------------------------------- plan --plot

SHIPPED = sorted((REPO / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_plot_phase_terms_add_up_to_plans_phases(path):
    """The components --plot stacks for each phase are the planner's own: they sum to plan's
    phase peaks, to the byte, for every shipped recipe."""
    from llama_npu.report.plan_picture import terms

    plan = json.loads(run_cli("plan", path, "--json").stdout)
    stacked = terms(plan)
    assert {phase: sum(alive.values()) for phase, alive in stacked.items()} == plan["phases"]
    assert {"weights", "activations", "logits_loss"} <= stacked["forward"].keys()
    assert "communication_buffers" not in {name for alive in stacked.values() for name in alive}  # drawn apart


def test_plot_draws_every_shipped_recipe_and_the_host_panel_for_offload(tmp_path, capsys):
    from matplotlib.image import imread

    from llama_npu.cli import main

    heights = {}
    for path in SHIPPED:
        out = tmp_path / f"{path.stem}.png"
        assert main(["plan", str(path), "--plot", str(out)]) == 0
        assert capsys.readouterr().out.rstrip().endswith(f"wrote {out}")
        pixels = imread(out)
        assert pixels.std() > 0.01, path.name
        heights[path.stem] = pixels.shape[0]
    offload = "llama3_2_3b_zh_full_offload_910a"
    # the host's bytes are a second panel: only the offload recipe's picture has it
    assert heights[offload] > max(h for name, h in heights.items() if name != offload)
    # --fit: the recipe as given beside the recommended plan, each phase by phase
    from llama_npu.cli import build_parser
    from llama_npu.report.plan_picture import plan_jsons

    fitted = ["plan", str(REPO / "recipes" / "llama3_2_3b_zh_full_8x910b.yaml"), "--fit", "--maximize", "speed",
              "--plot", str(tmp_path / "fit.png"), "--json"]
    assert main(fitted) == 0
    assert json.loads(capsys.readouterr().out)["recommended"] and imread(tmp_path / "fit.png").std() > 0.01
    assert [title for title, _ in plan_jsons(build_parser().parse_args(fitted))] == ["as given", "recommended"]


def test_plot_to_an_unwritable_place_is_refused_before_planning(tmp_path):
    (tmp_path / "file").write_text("")
    proc = run_cli("plan", SMOKE, "--plot", tmp_path / "file" / "plan.png")
    assert proc.returncode == 2 and proc.stderr.startswith("llama-npu: error: --plot ") and not proc.stdout
