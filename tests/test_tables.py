"""Spreadsheet instruction data (data/tables.py): CSV, TSV, .xlsx and Parquet read into the
same records as JSONL, columns named by data.columns, encodings detected or named, bad rows
named file:row; the warnings about too little data; the C-Eval GBK hint that converts a
whole layout."""
from __future__ import annotations

import csv
import json
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from openpyxl import Workbook

from conftest import SMOKE
from llama_npu.data.readers import RecordError, detect_format, read_dataset, read_records
from llama_npu.data.tables import ReadOptions

# An Excel export as a lab has it: Chinese headers, a quoted comma and quote, an answer over
# two lines, an empty input cell, an empty row, and a row without its answer (row 6).
HEADER = ["指令", "输入", "输出"]
ROWS = [["长城有多长？", "", "两万多公里，\"约 21,196 公里\"。"],
        ["写一首诗, 关于春天", "春天\n花开", "春风又绿江南岸，\n明月何时照我还。"],
        ["", "", ""],
        ["把下面的数相加", "1, 2", "3"],
        ["没有答案的问题", "", ""]]
ZH_MAP = {"instruction": "指令", "input": "输入", "output": "输出"}
SKIP = "data.on_bad_record=skip (prepare-data --on-bad-record skip) drops such records"


def write_table(path, header=HEADER, rows=ROWS, encoding="utf-8"):
    if path.suffix == ".xlsx":
        book = Workbook()
        for row in [header, *rows]:
            book.active.append([int(c) if c.isdigit() else c or None for c in row])  # a number cell, empty cells
        book.save(path)
    elif path.suffix == ".parquet":
        pq.write_table(pa.table({name: [row[i] or None for row in rows if any(row)]
                                 for i, name in enumerate(header)}), path)
    else:
        with open(path, "w", encoding=encoding, newline="") as fh:
            csv.writer(fh, delimiter="\t" if path.suffix == ".tsv" else ",").writerows([header, *rows])
    return path


def jsonl_twin(tmp_path):
    """The same records as JSONL with the alpaca keys: what every table must read as."""
    path = tmp_path / "twin.jsonl"
    path.write_text("".join(json.dumps(dict(zip(ZH_MAP, row)), ensure_ascii=False) + "\n" for row in ROWS if any(row)),
                    encoding="utf-8")
    return [r.messages for r in read_dataset([path], "alpaca", "skip")[0]]


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".xlsx", ".parquet"])
def test_a_table_reads_as_its_jsonl_twin_with_its_rows_named(tmp_path, suffix):
    data = write_table(tmp_path / f"lab{suffix}")
    options = ReadOptions.of(ZH_MAP)
    records, skipped = read_dataset([data], "alpaca", "skip", options)
    assert [r.messages for r in records] == jsonl_twin(tmp_path)
    assert records[1].messages[-2] == ("user", "写一首诗, 关于春天\n\n春天\n花开")  # comma and newlines kept
    rows = [2, 3, 5] if suffix != ".parquet" else [1, 2, 3]  # the header is row 1; Parquet has none
    assert [r.where for r in records] == [f"{data}:{row}" for row in rows]
    bad = f"{data}:{6 if suffix != '.parquet' else 4}"
    assert skipped.by_reason == {"empty answer": {"count": 1, "first": [bad]}}
    with pytest.raises(RecordError) as error:
        read_dataset([data], "alpaca", options=options)
    assert str(error.value) == f"{bad}: field 'output' is empty; expected a non-empty string; {SKIP}"
    assert detect_format(data, options) == "alpaca"


def test_alpaca_headers_need_no_map_and_llama_factory_names_map_too(tmp_path):
    plain = write_table(tmp_path / "plain.csv", header=list(ZH_MAP))
    assert [r.messages for r in read_dataset([plain], "alpaca", "skip")[0]] == jsonl_twin(tmp_path)
    factory = ReadOptions.of({"prompt": "指令", "query": "输入", "response": "输出"})  # dataset_info.json's names
    zh = write_table(tmp_path / "zh.csv")
    assert [r.messages for r in read_dataset([zh], "alpaca", "skip", factory)[0]] == jsonl_twin(tmp_path)
    with pytest.raises(RecordError) as error:
        read_records([tmp_path / "zh.csv"])
    assert "zh.csv:2: field 'instruction' is missing; expected a non-empty string (the record has '指令', '输入', " \
           "'输出'; data.columns: {instruction: NAME} reads it from another)" in str(error.value)
    with pytest.raises(RecordError, match=r"zh.csv: no column '问题' \(data.columns: instruction: 问题\); its "
                                          r"columns: 指令, 输入, 输出"):
        read_records([tmp_path / "zh.csv"], options=ReadOptions.of({"instruction": "问题"}))


def test_sharegpt_turns_in_a_csv_cell_or_a_parquet_list_map_to_conversations(tmp_path):
    turns = [{"from": "human", "value": "长城有多长？"}, {"from": "gpt", "value": "两万多公里。"}]
    expected = [("user", "长城有多长？"), ("assistant", "两万多公里。")]
    table = write_table(tmp_path / "chat.csv", header=["编号", "对话"],
                        rows=[["1", json.dumps(turns, ensure_ascii=False)], ["2", "[{\"from\": "]])
    pq.write_table(pa.table({"对话": [turns]}), tmp_path / "chat.parquet")
    options = ReadOptions.of({"conversations": "对话"})
    records, skipped = read_dataset([table, tmp_path / "chat.parquet"], "sharegpt", "skip", options)
    assert [r.messages for r in records] == [expected, expected] and detect_format(table, options) == "sharegpt"
    assert skipped.by_reason == {"malformed JSON": {"count": 1, "first": [f"{table}:3"]}}


def test_excels_utf8_bom_and_an_old_xls(tmp_path):
    bom = tmp_path / "bom.csv"  # Excel's "CSV UTF-8": a BOM and CRLF
    bom.write_bytes(b"\xef\xbb\xbfinstruction,output\r\n\xe9\x97\xae,\"\xe7\xad\x94, \xe5\xaf\xb9\"\r\n")
    for encoding in ("", "utf-8"):
        assert read_records([bom], options=ReadOptions.of({}, encoding))[0].messages == [("user", "问"),
                                                                                        ("assistant", "答, 对")]
    old = tmp_path / "old.xls"
    old.write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1")
    with pytest.raises(RecordError, match="old.xls: an Excel 97-2003 workbook; save it from Excel as .xlsx or CSV "
                                          "UTF-8"):
        read_records([old])


def test_a_gbk_export_is_named_by_its_encoding_or_converted_by_the_hinted_command(tmp_path):
    data = write_table(tmp_path / "导出.csv", encoding="gbk")
    with pytest.raises(RecordError) as error:
        read_records([data], options=ReadOptions.of(ZH_MAP))
    message = str(error.value)
    assert message.startswith(f"{data}:1: not UTF-8 (byte offset 2); it decodes as GBK; read it with "
                              f"data.encoding: gbk (prepare-data --encoding gbk), or convert it: iconv -f GBK")
    named = read_dataset([data], "alpaca", "skip", ReadOptions.of(ZH_MAP, "gbk"))[0]
    assert [r.messages for r in named] == jsonl_twin(tmp_path)
    subprocess.run(message.split("convert it: ", 1)[1], shell=True, check=True, cwd=tmp_path)  # the hint, as given
    converted = read_dataset([tmp_path / "导出.utf8.csv"], "alpaca", "skip", ReadOptions.of(ZH_MAP))[0]
    assert [r.messages for r in converted] == jsonl_twin(tmp_path)


def test_a_recipe_reads_a_table_by_its_columns_and_encoding_and_warns_of_too_little_data(tmp_path, capsys):
    from llama_npu.cli import build_parser

    data = write_table(tmp_path / "lab.csv", encoding="gbk")

    def validate(*sets):
        args = build_parser().parse_args(["validate", str(SMOKE), "--output-dir", str(tmp_path / "run"),
                                          *[a for s in sets for a in ("--set", s)]])
        code = args.func(args)
        lines = capsys.readouterr().err.splitlines(keepends=True)  # without the tokenizer's progress bar
        return code, "".join(line for line in lines if line.startswith(("[llama-npu]", "llama-npu:")))

    base = [f"data.train_files=[{data}]", "data.eval_files=[]", "data.columns={instruction: 指令, input: 输入, "
            "output: 输出}", "data.encoding=gbk", "data.on_bad_record=skip"]
    # 3 samples; 8 a step (global_batch_size) is more than the data has
    assert validate(*base) == (0, "[llama-npu] warning: the training data gives 3 rows, fewer than the 8 one "
                                  "optimizer step takes (train.global_batch_size, or micro_batch_size x data "
                                  "parallel): every step repeats rows; add data, or lower train.global_batch_size\n")
    code, err = validate(*base, "train.global_batch_size=1", "train.max_steps=61")
    assert code == 0 and err == ("[llama-npu] warning: train.max_steps=61 steps of 1 rows read the 3 rows of the "
                                 "training data 20 times (more than 20 passes), which learns it by heart; lower "
                                 "train.max_steps to about 60, or add data\n")
    assert validate(*base, "train.global_batch_size=1", "train.max_steps=60") == (0, "")
    code, err = validate(*base[:-1])
    assert code == 2 and err == f"llama-npu: error: {data}:6: field 'output' is empty; expected a non-empty string; " \
                                f"{SKIP}\n"


def test_a_gbk_exam_layout_is_converted_in_place_by_the_hinted_command(tmp_path):
    from llama_npu.evaluation.exams.layouts import read_exam

    (tmp_path / "val").mkdir()
    rows = [["id", "question", "A", "B", "C", "D", "answer"], ["0", "长城在哪个国家？", "中国", "日本", "法国", "英国", "A"]]
    for name, encoding in (("history_val.csv", "gbk"), ("law_val.csv", "utf-8")):
        with open(tmp_path / "val" / name, "w", encoding=encoding, newline="") as fh:
            csv.writer(fh).writerows(rows)
    with pytest.raises(RecordError) as error:
        read_exam("ceval", tmp_path, "val", None, 0)
    message = str(error.value)
    assert message.startswith(f"{tmp_path}/val/history_val.csv:2: not UTF-8 (byte offset 30); it decodes as GBK; "
                              f"convert every file of {tmp_path} to UTF-8 in place: find {tmp_path} -name '*.csv'")
    subprocess.run(message.split("in place: ", 1)[1], shell=True, check=True)
    exam = read_exam("ceval", tmp_path, "val", None, 0)
    assert {s: [q.doc["question"] for q in qs] for s, qs in exam.questions.items()} == \
        {"history": ["长城在哪个国家？"], "law": ["长城在哪个国家？"]}  # the UTF-8 file left as it was
