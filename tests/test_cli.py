"""The command line as a user first meets it: --help."""
import argparse
import json

import pytest

from llama_npu.cli import build_parser

from conftest import REPO, SMOKE, run_cli


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
    ["report", "runs/x", "--output"],
])
def test_a_destination_that_cannot_be_written_is_one_line_before_any_work(command, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("where the destination's parent should be a directory")
    proc = run_cli(*command, blocker / "out")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (f"llama-npu: error: {command[-1]} {blocker / 'out'} is not "
                                                    f"writable: {blocker} is a file, not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


@pytest.mark.parametrize("command, expected", [
    (["generate", "--checkpoint", "runs/x", "--prompt", "hi", "--max-new-tokens", "-3"],
     "--max-new-tokens: expected 1 or more, got -3"),
    (["generate", "--checkpoint", "runs/x", "--prompt", "hi", "--temperature", "0.5", "--top-p", "0"],
     "--top-p: expected a value in (0, 1], got 0.0"),
    (["generate", "--checkpoint", "runs/x", "--prompt", "hi", "--temperature", "-1"],
     "--temperature: expected a value > 0 (leave it out for greedy decoding), got -1.0"),
    (["eval", "--checkpoint", "runs/x", "--data", "data/zh_instruct_eval.jsonl", "--batch-size", "0"],
     "--batch-size: expected 1 or more, got 0"),
    (["eval", "--checkpoint", "runs/x", "--data", "data/zh_instruct_eval.jsonl", "--max-seq-len", "0"],
     "--max-seq-len: expected 1 to 131072 (Llama 3.2's context), got 0"),
    (["prepare-data", "--format", "alpaca", "--input", "data/zh_instruct_eval.jsonl", "--output", "out",
      "--max-seq-len", "0"],
     "--max-seq-len: expected 1 to 131072 (Llama 3.2's context), as data.max_seq_len, got 0"),
    (["prepare-data", "--format", "alpaca", "--input", "data/zh_instruct_eval.jsonl", "--output", "out",
      "--workers", "0"],
     "--workers: expected auto or 1 or more worker processes, got 0"),
    (["prepare-data", "--format", "alpaca", "--input", "data/zh_instruct_eval.jsonl", "--output", "out",
      "--workers", "all"],
     "--workers: expected auto or 1 or more worker processes, got all"),
])
def test_a_number_out_of_its_range_is_one_line_naming_the_flag(command, expected, tmp_path):
    """argparse's type=int takes 0 and -3: they were a silent default (eval --batch-size 0), an
    internal error (generate --max-new-tokens -3, --top-p 0) or a misleading 'all dropped'."""
    proc = run_cli(*command, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [f"llama-npu: error: {expected}"]
    assert list(tmp_path.iterdir()) == []


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


def test_print_example_shows_the_first_example_with_its_scored_tokens_marked_and_trains_nothing(tmp_path):
    record = json.loads((REPO / "data" / "zh_instruct_train.jsonl").read_text(encoding="utf-8").splitlines()[0])
    prompt = "\n\n".join(filter(None, [record["instruction"], record.get("input")]))
    out = tmp_path / "run"
    proc = run_cli("train", SMOKE, "--print-example", "--output-dir", out)
    assert proc.returncode == 0, proc.stderr
    # the prompt unscored, the reply and its closing <|eot_id|> scored, as the chat format says
    assert (f"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n{prompt}<|eot_id|><|start_header_id|>"
            f"assistant<|end_header_id|>\n\n⟦{record['output']}<|eot_id|>⟧") in proc.stdout
    assert not out.exists()
