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
from llama_npu.objectives.dpo.records import read_pairs
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


def test_a_jsonl_string_holding_a_line_separator(tmp_path):
    # JSON keeps U+2028 and U+0085 unescaped inside a string; str.splitlines() cut the line there.
    path = tmp_path / "data.jsonl"
    line = json.dumps({"text": "第一段\u2028第二段\x85完"}, ensure_ascii=False)
    path.write_text(line + "\r\n", encoding="utf-8")
    assert [r.text for r in read_records([str(path)], "text")] == ["第一段\u2028第二段\x85完"]


def test_an_exam_cell_holding_a_line_separator(tmp_path):
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "astronomy_test.csv").write_text("太阳\u2028是?,A,B,C,D,A\n", encoding="utf-8")
    exam = read_exam("mmlu", tmp_path, None, None, 0)
    assert [q.doc["question"] for q in exam.questions["astronomy"]] == ["太阳\u2028是?"]


def test_a_directory_named_like_an_exam_file(tmp_path):
    (tmp_path / "test" / "astronomy_test.csv").mkdir(parents=True)
    (tmp_path / "test" / "geography_test.csv").write_text("Q?,A,B,C,D,B\n", encoding="utf-8")
    assert list(read_exam("mmlu", tmp_path, None, None, 0).questions) == ["geography"]


def test_a_column_name_with_a_newline(tmp_path):
    path = tmp_path / "data.tsv"
    path.write_text('"指\n令"\toutput\n问\t答\n', encoding="utf-8")
    from llama_npu.data.tables import ReadOptions

    assert _refusal(read_records, [str(path)], "alpaca", ReadOptions.of({"instruction": "指令"})) == \
        f"{path}: no column '指令' (data.columns: instruction: 指令); its columns: 指\\n令, output"


def test_a_workbook_with_a_damaged_sheet(tmp_path):
    # The zip's directory reads, a member's deflate stream does not: zlib.error escaped openpyxl.
    from openpyxl import Workbook

    book = Workbook()
    book.active.append(["instruction", "output"])
    book.active.append(["问" * 200, "答" * 200])
    path = tmp_path / "data.xlsx"
    book.save(path)
    data = bytearray(path.read_bytes())
    at = data.index(b"xl/worksheets/sheet1.xml") + len("xl/worksheets/sheet1.xml") + 20  # inside its deflate data
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    assert _refusal(read_records, [str(path)], "alpaca").startswith(f"{path}: not a readable .xlsx workbook (")


def _tiny_hf(tmp_path, **changed):
    from fuzz_inputs import tiny_hf_files

    files = tiny_hf_files()
    for name, body in changed.items():
        files[name.replace("__", ".")] = body
    for name, body in files.items():
        (tmp_path / name).write_bytes(body)
    return tmp_path


@pytest.mark.parametrize("key, value, expected", [
    ("rope_scaling", 4096, "rope_scaling must be of rope_type 'llama3' (Llama 3.2), got 4096"),
    ("rope_theta", [500000.0], "rope_theta=[500000.0], expected 500000.0"),
    ("rope_theta", "500000", "rope_theta=500000, expected 500000.0"),
])
def test_config_values_of_another_type(tmp_path, key, value, expected):
    from fuzz_inputs import tiny_hf_files
    from llama_npu.weights.convert import checked_hf_model
    from llama_npu.weights.tensor_files import ConvertError

    config = json.loads(tiny_hf_files()["config.json"])
    config[key] = value
    src = _tiny_hf(tmp_path, config__json=json.dumps(config).encode())
    with pytest.raises(ConvertError) as refused:
        checked_hf_model(src)
    assert str(refused.value) == f"{src / 'config.json'}: {expected}"


@pytest.mark.parametrize("index", [{"weight_map": {"a": ["x"]}}, {"weight_map": {"a": "../config.json"}}, [1],
                                   {"metadata": {}}])
def test_a_shard_index_of_another_shape(tmp_path, index):
    from llama_npu.weights.convert import checked_hf_model
    from llama_npu.weights.tensor_files import ConvertError

    src = _tiny_hf(tmp_path, **{"model.safetensors.index.json": json.dumps(index).encode()})
    with pytest.raises(ConvertError) as refused:
        checked_hf_model(src)
    assert str(refused.value).startswith(f"{src / 'model.safetensors.index.json'}: ")


@pytest.mark.parametrize("tokenizer", [b"null", b"[]", b'{"model": 3}', b'{"model": {"vocab": [1]}}', b"\xff"])
def test_a_tokenizer_json_of_another_shape(tmp_path, tokenizer):
    from llama_npu.weights.convert import checked_hf_model
    from llama_npu.weights.tensor_files import ConvertError

    src = _tiny_hf(tmp_path, **{"tokenizer.json": tokenizer})
    with pytest.raises(ConvertError) as refused:
        checked_hf_model(src)
    assert str(refused.value).startswith(f"{src / 'tokenizer.json'}: ")


def test_a_safetensors_dtype_that_is_not_text(tmp_path):
    from fuzz_inputs import _safetensors, _split_header, tiny_hf_files
    from llama_npu.weights.convert import checked_hf_model
    from llama_npu.weights.tensor_files import ConvertError

    header, data = _split_header(tiny_hf_files()["model.safetensors"])
    header["model.norm.weight"]["dtype"] = ["F16"]
    src = _tiny_hf(tmp_path, model__safetensors=_safetensors(header, data))
    with pytest.raises(ConvertError, match=r"tensor model.norm.weight has dtype \['F16'\]; expected F32, F16 or BF16"):
        checked_hf_model(src)


@pytest.mark.parametrize("key, value, expected", [
    ("step", None, "step is None, expected 6"),
    ("step", 9, "step is 9, expected 6"),
    ("samples_consumed", "48", "samples_consumed is '48', expected a whole number"),
    ("loss_scale", 5, "loss_scale is 5, expected {scale: a number above 0, clean_steps: a whole number}"),
    ("crc32", {"model.ckpt": [1]}, "crc32 is {'model.ckpt': [1]}, expected file name -> CRC-32"),
])
def test_a_sidecar_whose_values_lie(tmp_path, key, value, expected):
    # With checksums.json sealed over it, the sidecar passed every check and resume read
    # state["step"] (KeyError, TypeError) or continued at another step than the directory's.
    from fuzz_inputs import _resealed, tiny_run_files
    from llama_npu.checkpoints.files import inspect

    files = tiny_run_files()
    state = json.loads(files["checkpoints/step_6/state.json"])
    state[key] = value
    files["checkpoints/step_6/state.json"] = json.dumps(state).encode()
    files["checkpoints/step_6/checksums.json"] = _resealed(files, "checkpoints/step_6")
    for name, body in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(body)
    assert inspect(tmp_path / "checkpoints" / "step_6", verify=True) == (None, f"sidecar state.json: {expected}")
    assert inspect(tmp_path / "checkpoints" / "step_3", verify=True)[1] is None


def test_a_device_count_past_any_cluster():
    # plan --fit searched the layouts of 10^9 devices for minutes (10^8: over 2 minutes).
    from llama_npu.cli import build_parser
    from llama_npu.memory.plan_report import run_plan

    args = build_parser().parse_args(["plan", "--model", "llama3.2-1b", "--device", "910a", "--devices",
                                      "1000000000", "--fit"])
    assert _refusal(run_plan, args) == "--devices: expected a count from 1 to 65,536, got 1000000000"


def test_a_sequence_past_llama_3_2s_context():
    # Accepted, the plan printed a 22-digit total that ran into its next column.
    assert _refusal(load_recipe, SMOKE, ["data.max_seq_len=1000000000000"]) == \
        "data.max_seq_len: expected 1 to 131072 (Llama 3.2's context), got 1000000000000"


def test_a_yaml_escape_past_unicode(tmp_path):
    # PyYAML raises a bare ValueError (chr() arg not in range) for "\U00110000".
    path = _recipe(tmp_path, 'model:\n  checkpoint: "\\U00110000"\n')
    assert _refusal(load_recipe, path) == f"{path}: not valid YAML (chr() arg not in range(0x110000))"


def test_nesting_thousands_deep(tmp_path):
    # RecursionError escaped the YAML and JSON parsers. At the command's own recursion limit
    # (hypothesis raises it in this process, which makes the parsers slow to reach it).
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        deep = "[" * 3000
        assert _refusal(load_recipe, _recipe(tmp_path, f"model: {deep}\n")).startswith(
            f"{tmp_path / 'recipe.yaml'}: not valid YAML (maximum recursion depth exceeded")
        jsonl = tmp_path / "data.jsonl"
        jsonl.write_text(deep + "\n", encoding="utf-8")
        assert _refusal(read_records, [str(jsonl)], "alpaca").startswith(
            f"{jsonl}:1: a record nested too deeply to read (thousands of levels)")
        array = tmp_path / "data.json"
        array.write_text("[" + deep, encoding="utf-8")
        assert _refusal(read_records, [str(array)], "alpaca") == \
            f"{array}:1: a record nested too deeply to read (thousands of levels)"
    finally:
        sys.setrecursionlimit(limit)


def test_a_config_json_nested_thousands_deep(tmp_path):
    from llama_npu.weights.convert import checked_hf_model
    from llama_npu.weights.tensor_files import ConvertError

    src = _tiny_hf(tmp_path, config__json=b"[" * 20_000)
    with pytest.raises(ConvertError, match=r"config.json: not readable JSON \(maximum recursion depth exceeded"):
        checked_hf_model(src)


def _tiny_run(tmp_path, files: dict):
    for name, body in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(body)


def test_a_refused_repair_of_killed_saves_changes_nothing(tmp_path):
    # The partial save of step_3 was removed before the incomplete old copy of step_9 was
    # judged and refused: the refusal left the run changed.
    from fuzz_inputs import DEAD_PID, snapshot, tiny_run_files
    from llama_npu.checkpoints.files import CheckpointError
    from llama_npu.checkpoints.leftovers import repair_killed_saves

    files = tiny_run_files()
    files[f"checkpoints/.step_3.partial-{DEAD_PID}/model.ckpt"] = files["checkpoints/step_3/model.ckpt"]
    files[f"checkpoints/.step_9.old-{DEAD_PID}/model.ckpt"] = files["checkpoints/step_6/model.ckpt"]
    _tiny_run(tmp_path, files)
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointError, match=rf"\.step_9\.old-{DEAD_PID} \(the old copy of step_9, whose re-save was "
                                              r"killed\) is not complete \(sidecar state.json unreadable"):
        repair_killed_saves(tmp_path)
    assert snapshot(tmp_path) == before

