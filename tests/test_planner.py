"""The memory planner: exact model-state formulas, the 3B-on-910A truth, --fit, JSON, errors."""
import json

import pytest

from llama_npu.memory.devices import DEVICES
from llama_npu.memory.planner import Strategy, estimate, lora_params_per_layer, split_params
from llama_npu.model import PRESETS, count_parameters
from llama_npu.recipe import load_recipe

from conftest import REPO, SMOKE, run_cli

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
    assert plan.total_bytes == sum(c.values())
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
    from llama_npu.build import build_network
    from llama_npu.model import resolve_shape
    from llama_npu.optim import build_optimizer
    from llama_npu.strategies.accumulation import TrainStep
    from llama_npu.strategies.precision import LossScaler

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
    assert result["components"]["optimizer_states"] == 8 * P["llama3.2-3b"]
    assert result["total_bytes"] == sum(result["components"].values())
    assert {"weights", "gradients", "optimizer_states", "activations", "logits_loss", "margin"} <= result["components"].keys()

    out = tmp_path / "fit.yaml"
    proc = run_cli("plan", SMOKE, "--set", "model.preset=llama3.2-3b", "--set", "data.max_seq_len=2048",
                   "--set", "device.target=ascend", "--set", "device.name=910a", "--device", "910a", "--devices", "1",
                   "--fit", "--write-recipe", out, "--json")
    result = json.loads(proc.stdout)
    assert proc.returncode == 0 and result["fits"] is False
    best = result["recommended"]
    assert best["fits"] and best["total_bytes"] <= best["device_bytes"] and best["strategy"]["lora"] is True
    recipe = load_recipe(out)  # the written plan validates as a recipe
    assert recipe.strategies.lora.enabled and recipe.device.name == "910a"
    assert recipe.strategies.precision.dtype == "float16"  # 910A has no BF16


def test_fit_prefers_sharding_to_lora_when_devices_allow():
    proc = run_cli("plan", "--model", "llama3.2-3b", "--device", "910b", "--devices", "8", "--fit", "--json")
    best = json.loads(proc.stdout)["recommended"]
    assert best["fits"] and best["strategy"]["lora"] is False and best["devices"] == 8


@pytest.mark.parametrize("args, message", [
    (["--model", "llama3.2-7b", "--device", "910a"], "--model: expected llama3.2-1b or llama3.2-3b"),
    (["--model", "llama3.2-1b", "--device", "910z"], "invalid choice: '910z'"),
    (["--model", "llama3.2-1b", "--device", "910a", "--seq-len", "200000"], "--seq-len: expected 1 to 131072"),
    (["--model", "llama3.2-1b", "--device", "910a", "--devices", "3"], "--devices 3: the layout is data 1"),
    ([str(SMOKE), "--device", "910b", "--set", "strategies.parallel.model=3", "--set", "device.target=ascend",
      "--set", "device.name=910b"], "strategies.parallel.model=3 must divide the attention heads"),
])
def test_bad_plan_input_is_one_line_with_exit_2(args, message):
    proc = run_cli("plan", *args)
    assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1]


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
    # docs/memory.md and its Chinese version are generated from these formulas and current
    check = subprocess.run([sys.executable, "scripts/memory_tables.py", "--check"], cwd=REPO,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
