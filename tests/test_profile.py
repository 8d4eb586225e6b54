"""`llama-npu profile`: the real CLI on the smoke recipe, shrunk, with a combination that
fails while training."""
from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import yaml

from conftest import SMOKE, TINY_RUN, run_cli

from llama_npu.recipe.load import load_recipe
from llama_npu.profiling.strategy_profile import classify_failure, combinations, default_axes

GOOD = "data/zh_instruct_train.jsonl"


@pytest.fixture(scope="module")
def profile_run(tmp_path_factory):
    """chunked CE on (the recipe has it off) x 1 or 4 micro-batches x good/bad training data:
    one combination of each outcome, each axis's values in the order given. TINY_RUN's global
    batch of 2 cannot be split into 4 micro-batches: the recipe refuses those combinations.
    The bad file passes validation (files are read when training starts), so its
    combination fails inside its training process."""
    tmp = tmp_path_factory.mktemp("profile")
    bad = tmp / "bad.jsonl"
    bad.write_text('{"instruction": "你好", "output": "好"}\n{not json\n', encoding="utf-8")
    out = tmp / "out"
    proc = run_cli("profile", SMOKE, "--out", out, "--steps", "2", *TINY_RUN,
                   "--combos", f"chunked_ce=on;accumulation=1,4;data.train_files={GOOD},{bad}", check=True)
    return out, proc, json.loads((out / "profile.json").read_text())


def test_profile_writes_one_row_per_combination(profile_run):
    out, proc, profile = profile_run
    rows = profile["rows"]
    assert [(r["combination"]["chunked_ce"], r["combination"]["accumulation"], r["status"]) for r in rows] == [
        ("on", "1", "ok"), ("on", "1", "failed"), ("on", "4", "skipped"), ("on", "4", "skipped")]
    ok, failed, skipped = ([r for r in rows if r["status"] == status] for status in ("ok", "failed", "skipped"))
    for row in ok + failed:
        assert row["planned_peak_bytes"] > 0
    for row in ok:
        assert row["median_step_seconds"] > 0 and row["tokens_per_s"] > 0 and row["compile_seconds"] >= 0
        assert row["peak_memory_bytes"] > 0 and row["memory_source"] == "host_rss"
        assert row["loss_finite"] and row["timed_steps"] == 2 and row["error"] is None
    for row in failed:
        assert "bad.jsonl:2:2: malformed JSON" in row["error"]
    for row in skipped:
        assert "does not split into 4 micro-batches" in row["error"]
    # Each row's settings reached its run, and its checkpoints were not kept.
    run_dir = Path(ok[0]["run_dir"])
    assert yaml.safe_load((run_dir / "recipe.yaml").read_text())["strategies"]["chunked_ce"]["enabled"] is True
    assert "--set strategies.chunked_ce.enabled=true" in ok[0]["command"]
    assert not (run_dir / "checkpoints").exists()
    assert "profile 4/4" in proc.stdout and "1 ok, 1 failed, 2 skipped" in proc.stdout


def test_profile_markdown_and_png(profile_run):
    out, _, profile = profile_run
    markdown = (out / "profile.md").read_text()
    table = [line for line in markdown.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(table) == len(profile["rows"]) == 4
    assert "not NPU memory" in markdown and f"{profile['machine']['cores']} cores" in markdown
    assert "(host_rss)" in table[0] and "malformed JSON" in table[1] and "skipped" in table[2]
    assert (out / "profile.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("spec, named", [
    ("precison=O0,O2", "unknown axis 'precison' (did you mean 'precision'?)"),
    ("precision=O0,O7", "precision=O7"),
    ("lora=off;train.micro_batch_size=2,zero", "train.micro_batch_size=zero"),
])
def test_bad_combos_is_one_line_exit_2(spec, named):
    proc = run_cli("profile", SMOKE, "--combos", spec, "--out", "/nonexistent/never-written")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("llama-npu: error: --combos: ")
    assert named in proc.stderr


def test_default_matrix_of_the_smoke_recipe():
    axes, notes = default_axes(SMOKE, [], load_recipe(SMOKE))
    assert axes == {"precision": ["O0", "O2"], "accumulation": ["1", "4"], "recompute": ["off", "on"],
                    "chunked_ce": ["off", "on"], "lora": ["off", "on"]} and notes == []
    assert len(combinations(axes)) == 32
    # On CPU the mixed level is float16 even when the recipe says bfloat16 (no CPU kernels).
    bf16 = ["strategies.precision.dtype=bfloat16"]
    assert default_axes(SMOKE, bf16, load_recipe(SMOKE, bf16))[0]["precision"] == ["O0", "O2:float16"]


def test_failures_that_mean_out_of_memory():
    assert classify_failure(-signal.SIGKILL, "")[0] == "out_of_memory"
    status, error = classify_failure(1, "train: 50%|#### \rTraceback (most recent call last):\n"
                                        "RuntimeError: Out of Memory!!! Request memory size: 4096\n"
                                        "- C++ Call Stack:\nmindspore/ccsrc/x.cc:1 Alloc\n")
    assert status == "out_of_memory" and error == "out of memory: RuntimeError: Out of Memory!!! Request memory size: 4096"
    assert classify_failure(-signal.SIGSEGV, "") == ("failed", "killed by signal SIGSEGV")
