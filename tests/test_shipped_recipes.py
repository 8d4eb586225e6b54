"""Every shipped recipe validates, fits its device by the planner with the margin, and
trains a few steps on CPU as its rehearsal (`train RECIPE --rehearse`), so a recipe can
never rot."""
import dataclasses
import json
import re

import numpy as np
import pytest
import yaml

from llama_npu.memory.devices import GB
from llama_npu.recipe.load import load_recipe
from llama_npu.recipe.schema import Recipe, with_absolute_paths
from llama_npu.strategies.accumulation import accumulation_steps
from llama_npu.training.rehearse import rehearse

from conftest import REPO, read_metrics, run_cli

ASCEND_RECIPES = sorted((REPO / "recipes").glob("llama3_2_*.yaml"))


def shrunk(path, *overrides) -> Recipe:
    """The recipe `train PATH --rehearse [--set ...]` trains: the tiny model on the CPU with the
    recipe's strategies (llama_npu/training/rehearse.py)."""
    return rehearse(load_recipe(path, list(overrides)))[0]


def test_the_ten_ascend_recipes_and_the_two_cpu_ones_are_shipped():
    assert [p.name for p in ASCEND_RECIPES] == [
        "llama3_2_1b_zh_dpo_lora_910a.yaml", "llama3_2_1b_zh_full_8x910a_dp.yaml", "llama3_2_1b_zh_full_910a.yaml",
        "llama3_2_1b_zh_full_910b.yaml", "llama3_2_1b_zh_lora_910a.yaml", "llama3_2_3b_zh_dpo_full_8x910b.yaml",
        "llama3_2_3b_zh_full_8x910b.yaml", "llama3_2_3b_zh_full_offload_910a.yaml", "llama3_2_3b_zh_lora_910a.yaml",
        "llama3_2_3b_zh_lora_int8_910a.yaml"]
    for path in ASCEND_RECIPES:
        assert path.read_text().startswith("# Llama 3.2"), f"{path.name} needs its header comment"
    assert sorted(p.name for p in (REPO / "recipes").glob("cpu_*.yaml")) == [
        "cpu_dpo_smoke.yaml", "cpu_kto_smoke.yaml", "cpu_llamafactory_smoke.yaml", "cpu_smoke.yaml"]
    assert [p.name for p in ASCEND_RECIPES if load_recipe(p).train.objective == "dpo"] == [
        "llama3_2_1b_zh_dpo_lora_910a.yaml", "llama3_2_3b_zh_dpo_full_8x910b.yaml"]


@pytest.mark.parametrize("path", ASCEND_RECIPES, ids=lambda p: p.stem)
def test_recipe_fits_its_device_with_the_margin_as_its_comment_says(path):
    """`plan RECIPE` (the recipe's own device and layout) fits with the 10% margin, and the
    header comment's "N GiB spare beyond the margin" is what plan prints, to its last digit."""
    recipe = load_recipe(path)
    par = recipe.strategies.parallel
    plan = json.loads(run_cli("plan", path, "--json", check=True).stdout)
    assert (plan["device"], plan["devices"]) == (recipe.device.name, par.data * par.model * par.pipeline)
    assert plan["fits"], f"{path.name}: {plan['total_bytes'] / GB:.2f} GB > {plan['device_bytes'] / GB:.2f} GB"
    assert plan["components"]["margin"] >= 0.1 * plan["device_bytes"]
    claimed = re.search(r"(\d+(?:\.(\d+))?) GiB spare beyond the (?:10% )?margin", " ".join(
        line.lstrip("# ") for line in path.read_text().splitlines() if line.startswith("#")))
    assert claimed, f"{path.name}: its header comment must say how much is spare"
    digits = len(claimed.group(2) or "")
    spare = (plan["device_bytes"] - plan["total_bytes"]) / GB  # GiB (MindSpore's "GB"), as plan prints it
    assert f"{spare:.{digits}f}" == claimed.group(1), f"{path.name}: comment says {claimed.group(1)}, plan {spare:.3f}"


@pytest.mark.parametrize("path", ASCEND_RECIPES, ids=lambda p: p.stem)
def test_recipe_rehearses_on_cpu_with_its_strategies(tmp_path, path):
    out = tmp_path / path.stem
    proc = run_cli("train", path, "--rehearse", "--output-dir", out, check=True)
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3] and all(np.isfinite(r["loss"]) for r in rows)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["memory_source"] == "host_rss" and summary["peak_memory_bytes"] < 4 * 2**30
    original, saved = load_recipe(path), yaml.safe_load((out / "recipe.yaml").read_text())
    dpo = original.train.objective == "dpo"
    assert ("eval_loss" in summary) != dpo  # evaluation is rehearsed too (a DPO run scores pairs with eval after)
    assert saved == with_absolute_paths(shrunk(path)).to_dict()  # its files named from any directory
    assert (saved["model"]["preset"], saved["device"]["target"], saved["data"]["max_seq_len"]) == ("tiny", "cpu", 32)
    if dpo:  # pairs: the policy is its own reference at step 1 (ln 2), TRL's metrics
        assert rows[0]["loss"] == pytest.approx(np.log(2), abs=1e-3) and rows[0]["target_tokens"] == 2
        assert all("rewards/margins" in r for r in rows)
        assert (out / "images" / "rewards.png").is_file()  # the objective's metrics, drawn as it logs them
        assert_a_dpo_rehearsal(proc.stdout, summary)
    s, kept = original.strategies, saved["strategies"]
    assert kept["lora"] == dataclasses.asdict(s.lora) and kept["recompute"]["mode"] == s.recompute.mode
    assert kept["precision"]["amp_level"] == s.precision.amp_level
    assert kept["precision"]["loss_scale"] == s.precision.loss_scale
    assert kept["chunked_ce"]["enabled"] == s.chunked_ce.enabled
    if s.chunked_ce.enabled:
        assert kept["chunked_ce"]["chunk_size"] < saved["data"]["max_seq_len"]  # really cut into chunks
    assert saved["train"]["global_batch_size"] == (2 if accumulation_steps(original) > 1 else 0)
    # What was shrunk and what was not rehearsed, in the summary and the printed report.
    report = summary["rehearsal"]
    assert f"model.preset '{original.model.preset}' -> 'tiny'" in report["shrunk"]
    assert any(item.startswith(f"the {original.device.name}'s kernels") for item in report["not_rehearsed"])
    if s.precision.amp_level != "O0" and s.precision.dtype == "bfloat16":
        assert "strategies.precision.dtype 'bfloat16' -> 'float16' (the CPU has no BF16 kernels)" in report["shrunk"]
    if s.parallel.data > 1:
        assert any(item.startswith(f"data parallel over {s.parallel.data} processes") for item in report["not_rehearsed"])
    if s.parallel.optimizer_shard:
        assert any(item.startswith("the sharded layout") for item in report["not_rehearsed"])
    for item in report["not_rehearsed"]:
        assert f"not rehearsed  {item}" in proc.stdout


def assert_a_dpo_rehearsal(stdout, summary):
    """A DPO rehearsal on the shipped pairs at 32 tokens: under data.truncation: keep_end every
    pair is cut to fit there, none skipped, and the reference pass covers only the 6 pairs its
    3 steps of 2 read (objectives/dpo/rehearsal.py), in the printed change list."""
    shrunk = summary["rehearsal"]["shrunk"]
    assert any(item.startswith("data.max_seq_len ") and item.endswith(" -> 32") for item in shrunk)
    assert not any("on_bad_record" in item for item in shrunk)
    assert "the first 6 training pairs only, what 3 steps read: the reference pass is over them" in shrunk
    assert "reference pass: the starting weights' log-probs of 6 pairs, before step 1" in stdout
    assert f"rehearsal      on the CPU; shrunk: {'; '.join(shrunk)}" in stdout


def test_the_cpu_dpo_smoke_recipe_rehearses_on_the_shipped_pairs(tmp_path):
    """`train recipes/cpu_dpo_smoke.yaml --rehearse`: 3 steps of DPO on the CPU, starting at
    ln 2 with rewards of 0 (fp32: the policy is exactly its own reference)."""
    out = tmp_path / "run"
    proc = run_cli("train", REPO / "recipes" / "cpu_dpo_smoke.yaml", "--rehearse", "--output-dir", out, check=True)
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[0]["target_tokens"] == 2
    assert rows[0]["loss"] == pytest.approx(np.log(2), abs=1e-5) and abs(rows[0]["rewards/margins"]) < 1e-5
    assert_a_dpo_rehearsal(proc.stdout, json.loads((out / "summary.json").read_text()))


@pytest.mark.parametrize("objective, entry, first_loss", [("sft", "zh_alpaca_demo, zh_sharegpt_demo", None),
                                                       ("dpo", "zh_dpo_demo", np.log(2)), ("kto", "zh_kto_demo", 0.5)])
def test_the_llamafactory_recipe_trains_a_step_of_each_objective_on_its_entries(tmp_path, objective, entry,
                                                                                first_loss):
    """recipes/cpu_llamafactory_smoke.yaml reads data/llamafactory/dataset_info.json as
    LLaMA-Factory does: its alpaca and sharegpt entries (SFT), its ranking entry (DPO) and its
    KTO entry (role/content turns, the tag in `label`) each train a step, no column renamed;
    DPO and KTO start where the policy is its own reference (ln 2, 0.5)."""
    out = tmp_path / objective
    proc = run_cli("train", REPO / "recipes" / "cpu_llamafactory_smoke.yaml", "--output-dir", out,
                   "--set", f"train.objective={objective}", "--set", f"data.dataset={entry}",
                   "--set", "train.max_steps=1", "--set", "train.micro_batch_size=1",
                   "--set", "train.global_batch_size=2", check=True)
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1] and np.isfinite(rows[0]["loss"])
    if first_loss is not None:
        assert rows[0]["loss"] == pytest.approx(first_loss, abs=1e-4)
    for name in entry.split(", "):
        assert re.search(rf"{name} \(\S*data/llamafactory/{name}\.json\)", proc.stdout), proc.stdout
    saved = yaml.safe_load((out / "recipe.yaml").read_text())["data"]
    assert saved["dataset_dir"].startswith("/") and saved["dataset_dir"].endswith("data/llamafactory")


def test_the_int8_lora_recipe_spends_what_its_base_frees():
    """llama3_2_3b_zh_lora_int8_910a.yaml trains more tokens a micro-batch than the FP16-base
    LoRA recipe, at a size the planner says an FP16 base could not hold on its 910A."""
    from llama_npu.memory.devices import get_device
    from llama_npu.memory.parameter_count import cached_parameter_count
    from llama_npu.memory.planner import estimate, strategy_from_recipe
    from llama_npu.model.architecture import resolve_shape

    int8, fp16 = (load_recipe(REPO / "recipes" / f"llama3_2_3b_zh_lora{k}_910a.yaml") for k in ("_int8", ""))
    assert int8.strategies.lora.base_dtype == "int8" and fp16.strategies.lora.base_dtype == "compute"
    tokens = [r.data.max_seq_len * r.train.micro_batch_size for r in (int8, fp16)]
    assert tokens[0] > tokens[1]
    shape, device = resolve_shape(int8.model), get_device("910a", int8.device.max_device_memory)
    plans = {dtype: estimate(shape, cached_parameter_count(shape), device, dataclasses.replace(
        strategy_from_recipe(int8, "910a"), lora_base_dtype=dtype)) for dtype in ("int8", "compute")}
    assert plans["int8"].fits and not plans["compute"].fits


def test_the_3b_full_fine_tune_fits_one_910a_only_with_the_optimizer_on_the_host():
    """recipes/llama3_2_3b_zh_full_offload_910a.yaml: a full fine-tune (FP16 with dynamic loss
    scaling, at least 2,048 tokens, at least 4 accumulated) that plan fits with 2 GB spare beyond
    the margin; the card holds the FP16 weights and one micro-batch's FP16 gradients, the host
    the fp32 master, the moments and the accumulators. With the optimizer on the card: exit 1."""
    path = REPO / "recipes" / "llama3_2_3b_zh_full_offload_910a.yaml"
    recipe = load_recipe(path)
    p = recipe.strategies.precision
    assert not recipe.strategies.lora.enabled and recipe.strategies.offload.optimizer == "host"
    assert (p.amp_level, p.dtype, p.loss_scale) == ("O2", "float16", "dynamic") and recipe.device.name == "910a"
    assert recipe.data.max_seq_len >= 2048 and accumulation_steps(recipe) >= 4
    proc = run_cli("plan", path, "--json", check=True)
    plan, params = json.loads(proc.stdout), 3_212_749_824
    assert plan["device_bytes"] - plan["total_bytes"] >= 2 * GB
    c, host = plan["components"], plan["host"]
    assert c["optimizer_states"] == c["weight_compute_copies"] == c["micro_batch_gradients"] == c["update_copies"] == 0
    assert 2 * params < c["weights"] == c["gradients"] < 2 * params + 2**20  # fp16, the RMSNorm gains fp32
    embedding = 128_256 * 3072  # the largest tensor, in flight in fp16
    assert host["components"] == {"master_weights": 4 * params, "moments": 8 * params, "accumulators": 4 * params,
                                  "staging": 2 * embedding}
    assert f"{(4 + 8) * params / GB:.1f}" == "35.9" and f"{4 * params / GB:.1f}" == "12.0"  # the figures
    assert host["rank_bytes"] == host["node_bytes"] == 16 * params + 2 * embedding
    assert host["update_seconds"] == pytest.approx(params * 28 / 20e9)
    k = accumulation_steps(recipe)
    assert host["transfer_bytes"] == {"to_host": k * 2 * params, "to_device": 2 * params}
    text = run_cli("plan", path, check=True).stdout
    assert "host (optimizer on the host): 48.61 GiB a rank (master_weights 11.97, moments 23.94, accumulators " \
        "11.97, staging 0.73), 48.61 GiB a node of 1 rank" in text
    on_card = run_cli("plan", path, "--set", "strategies.offload.optimizer=device", "--json")
    in_graph = json.loads(on_card.stdout)
    assert on_card.returncode == 1 and not in_graph["fits"] and in_graph["host"] is None
    assert in_graph["components"]["optimizer_states"] == 8 * params


def printed_step_time(text: str) -> tuple:
    """({part: seconds or None}, total or None) from plan's text: the rows under "step time"."""
    block = text[text.index("  step time, predicted"):].splitlines()
    rows = [re.match(r"    (\w+)\s+([\d.]+|unknown)  ", line) for line in block[1:]]
    rows = [m for m in rows if m and m.group(1) != "part"]
    seconds = {m.group(1): None if m.group(2) == "unknown" else float(m.group(2)) for m in rows}
    return {k: v for k, v in seconds.items() if k != "total"}, seconds["total"]


@pytest.mark.parametrize("path", ASCEND_RECIPES + sorted((REPO / "recipes").glob("cpu_*.yaml")), ids=lambda p: p.stem)
def test_plan_predicts_a_step_time_whose_parts_add_up_or_says_the_peak_is_unknown(path):
    """`plan RECIPE` prints a step time part by part, in text and JSON: the parts add to the
    total; where the device has no sourced peak (memory/peaks.py: the 910b, which stands for the
    B2 and the B3, the 910b4, the CPU) the compute and the total are "unknown", never guessed."""
    plan = json.loads(run_cli("plan", path, "--json").stdout)
    text = run_cli("plan", path).stdout
    time = plan["step_time"]
    parts, total = printed_step_time(text)
    assert list(parts) == list(time["parts"]) and {"model", "attention"} <= parts.keys()
    if plan["device"] == "910a":
        assert time["peak_tflops"] == 256 and "Huawei's published figure" in time["peak_source"]
        assert time["total_seconds"] == pytest.approx(sum(time["parts"].values()), rel=1e-12)
        assert total == pytest.approx(sum(parts.values()), abs=0.005 * len(parts) + 0.005)
        assert total == pytest.approx(time["total_seconds"], abs=0.005)
    else:
        assert time["total_seconds"] is None and time["parts"]["model"] is None and parts["model"] is None
        assert total is None and "card compute: unknown peak: " in text and "give --peak-tflops" in text
    if load_recipe(path).strategies.offload.optimizer == "host":
        assert {"host_accumulate", "host_step_end", "host_push", "pcie_gradients_to_host"} <= parts.keys()
