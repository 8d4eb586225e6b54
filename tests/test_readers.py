"""What the readers say about input they cannot use: the format, the field, the position."""
import json

import pytest

from llama_npu.data.readers import RecordError, read_records

from conftest import run_cli

SHAREGPT = {"conversations": [{"from": "human", "value": "北京有什么好玩的？"}, {"from": "gpt", "value": "故宫。"}]}


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_a_sharegpt_file_read_as_alpaca_says_which_format_it_is(tmp_path):
    src = write(tmp_path / "chat.jsonl", (json.dumps(SHAREGPT, ensure_ascii=False) + "\n") * 3)
    proc = run_cli("prepare-data", "--format", "alpaca", "--input", src, "--output", tmp_path / "out")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"llama-npu: error: {src}:1: read as alpaca, but the record has 'conversations', "
                                   f"a sharegpt field: set data.format: sharegpt in the recipe (prepare-data: --format sharegpt)")
    skipped = run_cli("prepare-data", "--format", "alpaca", "--input", src, "--output", tmp_path / "out",
                      "--on-bad-record", "skip")
    assert skipped.returncode == 2 and not (tmp_path / "out").exists()
    assert f"skipped 3, dropped 0); most skipped as sharegpt record read as alpaca (first at {src}:1)" \
        in skipped.stderr


@pytest.mark.parametrize("turn, message", [
    ({"from": "gpt"}, "turn 2: field 'value' is missing; expected a non-empty string"),
    ({"from": "gpt", "value": " "}, "turn 2: field 'value' is empty; expected a non-empty string"),
])
def test_a_missing_answer_is_not_called_empty(tmp_path, turn, message):
    record = {"conversations": [SHAREGPT["conversations"][0], turn]}
    with pytest.raises(RecordError, match=message) as caught:
        read_records([write(tmp_path / "s.jsonl", json.dumps(record) + "\n")], "sharegpt")
    assert caught.value.reason == ("missing 'value'" if "missing" in message else "empty answer")


def test_an_empty_user_turn_is_refused(tmp_path):
    record = {"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "好的。"}]}
    with pytest.raises(RecordError, match=r"s.jsonl:1 turn 1: field 'content' is empty") as caught:
        read_records([write(tmp_path / "s.jsonl", json.dumps(record) + "\n")], "sharegpt")
    assert caught.value.reason == "empty user turn"


def test_json_errors_keep_line_and_column(tmp_path):
    array = write(tmp_path / "a.json", '[\n  {"instruction": "a", "output": "b"},\n  {"instruction": "a" "output": "b"}\n]')
    with pytest.raises(RecordError, match=r"a.json:3:23: malformed JSON array \(Expecting ',' delimiter\)"):
        read_records([array], "alpaca")


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_jsonl_and_csv_stream_so_memory_does_not_grow_with_the_file(suffix, tmp_path):
    """prepare-data on a data set larger than RAM (#43): the readers hold a line at a time, not
    the file's text. Python's own allocations while counting 20,000 records (5 MB) stay under
    1 MB; reading the text whole took 4 times the file."""
    import csv
    import tracemalloc

    from llama_npu.data.readers import SkipReport, good_records

    record = {"instruction": "请把下面的句子翻译成英文。" * 3, "input": "今天天气很好。",
              "output": "The weather is nice today. " * 3}
    path = tmp_path / f"big{suffix}"
    with open(path, "w", encoding="utf-8", newline="") as f:
        if suffix == ".csv":
            writer = csv.writer(f)
            writer.writerows([record.keys()] + [record.values()] * 20_000)
        else:
            f.writelines([json.dumps(record, ensure_ascii=False) + "\n"] * 20_000)
    assert path.stat().st_size > 4_000_000
    tracemalloc.start()
    try:
        count = sum(1 for _ in good_records([str(path)], "alpaca", "error", SkipReport()))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == 20_000 and peak < 1_000_000, peak
