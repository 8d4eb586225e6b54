"""No silent random base: a LoRA recipe names its base weights (model.checkpoint) or says
it means random ones (model.random_init: true); `plan --write-recipe` leaves a placeholder
that validate refuses by name; a rehearsal says its base is random."""
from __future__ import annotations

import pytest

from conftest import REPO, SMOKE, run_cli

LORA_RECIPES = sorted(REPO.glob("recipes/*lora*.yaml"))
# On this host without an NPU: the recipe's own checks at the tiny shape the converted test weights have.
ON_CPU = ["model.preset=tiny", "device.target=cpu", "device.name=cpu", "device.max_device_memory="]


def validate(capsys, recipe, *sets, rehearse=False) -> tuple[int, str]:
    """(exit code, stderr) of `llama-npu validate RECIPE --set ...`, in this process (it loads no MindSpore)."""
    from llama_npu.cli import build_parser

    args = build_parser().parse_args(["validate", str(recipe), *[a for s in sets for a in ("--set", s)],
                                      *(["--rehearse"] if rehearse else [])])
    code = args.func(args)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("recipe", LORA_RECIPES, ids=lambda p: p.stem)
def test_a_shipped_lora_recipe_is_refused_without_a_checkpoint_and_valid_with_one(recipe, conversions, capsys):
    assert len(LORA_RECIPES) == 4  # 1B and 3B over an fp16 base, 3B over an int8 base, 1B DPO
    code, err = validate(capsys, recipe, *ON_CPU)
    assert code == 2
    assert ("llama-npu: error: model.checkpoint is not set, so LoRA would train adapters over random weights"
            in err) and "model.random_init: true" in err
    for accepted in (f"model.checkpoint={conversions['float32']}", "model.random_init=true"):
        code, err = validate(capsys, recipe, *ON_CPU, accepted)
        assert code == 0 and "error:" not in err  # (it warns that the shipped sample is small for 1000 steps)


def test_train_refuses_a_random_lora_base_before_writing_anything(tmp_path, capsys):
    out = tmp_path / "run"
    proc = run_cli("train", SMOKE, "--output-dir", out, "--set", "strategies.lora.enabled=true",
                   "--set", "model.random_init=false")
    assert proc.returncode == 2 and "model.checkpoint is not set" in proc.stderr and not out.exists()
    # the smoke recipe sets random_init: true, and a checkpoint given still counts
    code, err = validate(capsys, SMOKE, "model.checkpoint=weights/x")
    assert code == 2 and "model.checkpoint=weights/x" in err and "random" not in err


def test_the_placeholder_plan_writes_for_lora_is_refused_by_name(tmp_path, capsys):
    from llama_npu.recipe.base_weights import CHECKPOINT_PLACEHOLDER
    from llama_npu.recipe.load import load_recipe

    out = tmp_path / "fit.yaml"
    run_cli("plan", "--model", "llama3.2-3b", "--device", "910a", "--fit", "--no-offload", "--write-recipe", out,
            "--data", "data/zh_instruct_train.jsonl", check=True)  # --no-offload: LoRA, not the optimizer on the host
    recipe = load_recipe(out)
    assert recipe.strategies.lora.enabled and recipe.model.checkpoint == CHECKPOINT_PLACEHOLDER
    code, err = validate(capsys, out, rehearse=True)
    assert code == 2
    assert f"model.checkpoint: still the placeholder plan --write-recipe wrote ('{CHECKPOINT_PLACEHOLDER}')" in err


def test_a_rehearsal_says_its_base_is_random():
    from llama_npu.recipe.load import load_recipe
    from llama_npu.training.rehearse import rehearse

    _, shrunk, _ = rehearse(load_recipe(LORA_RECIPES[0]))
    assert "the base is random weights: the recipe sets no model.checkpoint, which train and validate refuse " \
           "for LoRA" in shrunk
    _, shrunk, _ = rehearse(load_recipe(SMOKE))
    assert "the base is random weights: model.random_init: true" in shrunk
