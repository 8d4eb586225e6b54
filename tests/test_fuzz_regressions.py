"""Each defect the fuzz suite (tests/test_fuzz.py, scripts/fuzz.py) found, as the minimal
input that showed it: a traceback, or a refusal of more than one line, before the fix.
All in-process, no MindSpore: about 2 s in all."""
from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import pytest

from conftest import REPO, SMOKE
from llama_npu.data.pairs import read_pairs
from llama_npu.data.readers import RecordError, read_records
from llama_npu.evaluation.exams.layouts import read_exam
from llama_npu.recipe.load import load_recipe
from llama_npu.recipe.problems import RecipeError


def _refusal(call, *args) -> str:
    """The one-line message `call(*args)` refuses with."""
    with pytest.raises((RecipeError, RecordError)) as refused:
        call(*args)
    message = str(refused.value)
    assert "\n" not in message and "\r" not in message
    return message


def _recipe(tmp_path, text: str | bytes):
    path = tmp_path / "recipe.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def test_a_key_written_with_no_value(tmp_path):
    # YAML reads `eval_every:` as null; it reached the range check as None (TypeError).
    text = SMOKE.read_text(encoding="utf-8").replace("  keep_last: 2\n", "  keep_last: 2\n  eval_every:\n")
    assert _refusal(load_recipe, _recipe(tmp_path, text)) == \
        "train.eval_every: no value; expected int (or leave the key out for its default)"


def test_a_strategy_key_with_no_value(tmp_path):
    text = SMOKE.read_text(encoding="utf-8").replace("    rank: 8\n", "    rank: 8\n    dropout:\n")
    assert _refusal(load_recipe, _recipe(tmp_path, text)).startswith(
        "strategies.lora.dropout: no value; expected float")


@pytest.mark.parametrize("value", ["nan", ".nan", "-.inf", "1e400"])
def test_a_number_that_is_not_finite(value):
    # NaN passed every range check (NaN compares false) and an infinite lr was accepted.
    message = _refusal(load_recipe, SMOKE, [f"train.optimizer.lr={value}"])
    assert message.startswith("train.optimizer.lr: expected a finite number, got ")


def test_a_recipe_that_is_not_utf8(tmp_path):
    path = _recipe(tmp_path, "model:\n  preset: tiny  # 微调\n".encode("gbk"))
    message = _refusal(load_recipe, path)
    assert message.startswith(f"{path}: not UTF-8 text (byte offset ") and message.endswith("save the recipe as UTF-8")


def test_a_control_character_in_a_recipe(tmp_path):
    # PyYAML's ReaderError carries no mark and a message over two lines.
    path = _recipe(tmp_path, "model:\n  preset: tiny\ntrain\x1a:\n  max_steps: 2\n")
    assert _refusal(load_recipe, path) == (f"{path}:3: not valid YAML (unacceptable character #x001a: special "
                                           f"characters are not allowed in \"<unicode string>\", position 27)")


def test_a_set_key_with_a_newline():
    assert _refusal(load_recipe, SMOKE, ["model.preset.\n="]) == \
        "--set model.preset.\\n: 'model.preset' is not a section"
    assert _refusal(load_recipe, SMOKE, ["trai\rn.seed=1"]).startswith("unknown key 'trai\\rn'")


def _jsonl(tmp_path, *records) -> str:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def test_a_sharegpt_role_that_is_not_text(tmp_path):
    # A list or a mapping as a turn's role was looked up in a dict: TypeError, unhashable.
    turns = [{"from": ["human"], "value": "你好"}, {"from": "gpt", "value": "好"}]
    path = _jsonl(tmp_path, {"conversations": turns})
    assert _refusal(read_records, [path], "sharegpt").startswith(f"{path}:1 turn 1: unknown role ['human']; expected")


def test_a_pair_reply_whose_role_is_not_text(tmp_path):
    path = _jsonl(tmp_path, {"instruction": "问", "chosen": {"role": {"a": 1}, "content": "好"}, "rejected": "差"})
    assert _refusal(read_pairs, [path], "alpaca").startswith(
        f"{path}:1: 'chosen' is a message from {{'a': 1}}; expected the assistant's reply")


def test_a_damaged_parquet_page(tmp_path):
    # The footer reads, so the file opens; the damaged page header shows only when its batch
    # is decoded, where pyarrow's OSError escaped, its message ending in a newline.
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = io.BytesIO()
    pq.write_table(pa.table({"text": ["你好世界"] * 3}), out, compression="none", use_dictionary=False)
    data = bytearray(out.getvalue())
    data[4] ^= 0xFF  # the first page header, right after the magic PAR1
    path = tmp_path / "data.parquet"
    path.write_bytes(bytes(data))
    assert _refusal(read_records, [str(path)], "text").startswith(f"{path}: not a readable Parquet file (")


def test_a_table_with_both_turn_columns(tmp_path):
    # Rows in ShareGPT's two layouts share one header: a row's empty cell of the other layout
    # is no field, not an empty conversation.
    path = tmp_path / "chat.csv"
    turns = json.dumps([{"role": "user", "content": "你好"}, {"role": "assistant", "content": "你好！"}],
                       ensure_ascii=False)
    old = json.dumps([{"from": "human", "value": "在吗"}, {"from": "gpt", "value": "在"}], ensure_ascii=False)
    with open(path, "w", encoding="utf-8", newline="") as fh:
        csv.writer(fh).writerows([["conversations", "messages"], ["", turns], [old, ""]])
    records = read_records([str(path)], "sharegpt")
    assert [r.messages for r in records] == [[("user", "你好"), ("assistant", "你好！")],
                                             [("user", "在吗"), ("assistant", "在")]]


def test_an_exam_cell_past_the_csv_field_limit(tmp_path):
    # An unclosed quote makes the rest of the file one cell; csv.Error escaped the reader.
    (tmp_path / "test").mkdir()
    path = tmp_path / "test" / "astronomy_test.csv"
    path.write_text('"' + "x" * 140_000 + ",A,B,C,D,A\n", encoding="utf-8")
    raised = csv.field_size_limit(131_072)  # the csv module's default, which a library imported earlier may raise
    try:
        assert _refusal(read_exam, "mmlu", tmp_path, None, None, 0) == \
            f"{path}:1: not valid CSV (field larger than field limit (131072))"
    finally:
        csv.field_size_limit(raised)


def test_an_internal_error_is_one_line_and_a_file(tmp_path):
    # A defect of ours (here: a command that fails on a bug) prints one line naming the file
    # that holds the traceback, exit 1, and no traceback on the console.
    script = ("import sys; import llama_npu.commands.doctor as d\n"
              "def broken(args): {}['no such key']\n"
              "d.run = broken\n"
              "from llama_npu.cli import main; sys.exit(main(['doctor']))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    line, = proc.stderr.splitlines()
    assert line.startswith("llama-npu: error: internal error, not a problem of your input: KeyError: 'no such key' "
                           f"(the full traceback is in {tmp_path}/llama-npu-traceback-")
    saved, = tmp_path.glob("llama-npu-traceback-*.txt")
    assert "in broken" in saved.read_text(encoding="utf-8") and str(saved) in line
