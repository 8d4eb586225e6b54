"""Every shipped recipe validates, fits its device by the planner with the margin, and
trains 2 steps on CPU when shrunk to the tiny preset, so a recipe can never rot."""
import json

import numpy as np
import pytest
import yaml

from llama_npu.recipe import load_recipe

from conftest import REPO, read_metrics, run_cli

ASCEND_RECIPES = sorted((REPO / "recipes").glob("llama3_2_*.yaml"))
SHRINK = ["model.preset=tiny", "device.target=cpu", "device.name=cpu", "device.max_device_memory=",
          "strategies.precision.amp_level=O0", "strategies.precision.loss_scale=none", "strategies.parallel.data=1",
          "strategies.parallel.optimizer_shard=false", "data.max_seq_len=32", "data.eval_files=[]",
          "train.micro_batch_size=1", "train.global_batch_size=2", "strategies.chunked_ce.chunk_size=16",
          "train.max_steps=2", "train.warmup_steps=0", "train.save_every=2"]


def test_the_five_ascend_recipes_are_shipped():
    assert [p.name for p in ASCEND_RECIPES] == [
        "llama3_2_1b_zh_full_8x910a_dp.yaml", "llama3_2_1b_zh_full_910a.yaml", "llama3_2_1b_zh_full_910b.yaml",
        "llama3_2_3b_zh_full_8x910b.yaml", "llama3_2_3b_zh_lora_910a.yaml"]
    for path in ASCEND_RECIPES:
        assert path.read_text().startswith("# Llama 3.2"), f"{path.name} needs its header comment"


@pytest.mark.parametrize("path", ASCEND_RECIPES, ids=lambda p: p.stem)
def test_recipe_fits_its_device_with_the_margin(path):
    recipe = load_recipe(path)
    par = recipe.strategies.parallel
    devices = par.data * par.model * par.pipeline
    proc = run_cli("plan", path, "--device", recipe.device.name, "--devices", devices, "--json", check=True)
    plan = json.loads(proc.stdout)
    assert plan["fits"], f"{path.name}: {plan['total_bytes'] / 1e9:.2f} GB > {plan['device_bytes'] / 1e9:.2f} GB"
    assert plan["components"]["margin"] >= 0.1 * plan["device_bytes"]


@pytest.mark.parametrize("path", ASCEND_RECIPES, ids=lambda p: p.stem)
def test_recipe_trains_two_steps_on_cpu_when_shrunk(tmp_path, path):
    out = tmp_path / path.stem
    run_cli("train", path, "--output-dir", out, *[a for s in SHRINK for a in ("--set", s)], check=True)
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2] and all(np.isfinite(r["loss"]) for r in rows)
    saved = yaml.safe_load((out / "recipe.yaml").read_text())
    original = yaml.safe_load(path.read_text())
    assert saved["strategies"]["lora"]["enabled"] == original["strategies"].get("lora", {}).get("enabled", False)
