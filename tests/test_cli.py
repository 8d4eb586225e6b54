"""The command line as a user first meets it: --help."""
import argparse

import pytest

from llama_npu.cli import build_parser

from conftest import run_cli


@pytest.mark.quick
def test_every_option_of_every_command_has_a_help_text():
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    undocumented = {name: [a.dest for a in command._actions if not a.help] for name, command in commands.items()}
    assert {name: dests for name, dests in undocumented.items() if dests} == {}


def test_help_shows_defaults_and_is_written_for_users():
    top = run_cli("--help", check=True).stdout
    assert "Fine-tune Llama 3.2 1B/3B on Chinese data" in top and "typical use:" in top and "exit codes:" in top
    assert "parsing" not in top  # the module docstring is for developers
    ev = " ".join(run_cli("eval", "--help", check=True).stdout.split())
    assert "(default: 4)" in ev and "(default: auto)" in ev and "(default: None)" not in ev
    assert "default: a run's own data.max_seq_len, so the loss is its held-out loss; else 2048" in ev
    prep = " ".join(run_cli("prepare-data", "--help", check=True).stdout.split())
    assert prep.startswith("usage: llama-npu prepare-data") and "(default: error)" in prep


@pytest.mark.parametrize("command", [
    ["convert", "hf-to-ms", "--src", "Llama-3.2-1B", "--dst"],
    ["convert", "ms-to-hf", "--src", "runs/x", "--dst"],
    ["quantize", "--checkpoint", "runs/x", "--dst"],
    ["merge-checkpoints", "runs/x", "--dst"],
    ["prepare-data", "--format", "alpaca", "--input", "data/zh_instruct_train.jsonl", "--output"],
    ["eval", "--task", "ceval", "--checkpoint", "runs/x", "--data", "data/ceval_sample", "--output"],
    ["plan", "--model", "llama3.2-1b", "--device", "910b", "--fit", "--data", "data/zh_instruct_train.jsonl",
     "--write-recipe"],
    ["profile", "recipes/cpu_smoke.yaml", "--out"],
])
def test_a_destination_that_cannot_be_written_is_one_line_before_any_work(command, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("where the destination's parent should be a directory")
    proc = run_cli(*command, blocker / "out")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (f"llama-npu: error: {command[-1]} {blocker / 'out'} is not "
                                                    f"writable: {blocker} is a file, not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_the_readmes_own_data_check_passes_after_the_smoke_run(tmp_path):
    """README, "Your own data": its `validate` runs after scripts/smoke.sh has filled
    runs/cpu_smoke, so it must check the output directory the `train` below it writes."""
    import shlex
    import shutil

    from conftest import REPO

    block = (REPO / "README.md").read_text(encoding="utf-8").split("### Your own data", 1)[1].split("```")[1]
    validate, train = (shlex.split(next(line for line in block.splitlines() if line.startswith(f"llama-npu {cmd} ")))
                       for cmd in ("validate", "train"))
    (tmp_path / "recipes").symlink_to(REPO / "recipes")
    shutil.copy(REPO / "data" / "zh_instruct_train.jsonl", tmp_path / "my_train.jsonl")
    (tmp_path / "runs" / "cpu_smoke").mkdir(parents=True)
    (tmp_path / "runs" / "cpu_smoke" / "recipe.yaml").write_text("as the smoke run left it\n")
    proc = run_cli(*validate[1:], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert validate[validate.index("--output-dir") + 1] == train[train.index("--output-dir") + 1]
