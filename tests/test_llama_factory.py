"""Data in LLaMA-Factory's alpaca and sharegpt layouts (its data/README.md): `history`,
`system` and the sharegpt `system` column read into the turns its converter builds
(src/llamafactory/data/converter.py), tokenized by train and by eval --data to the ids its
Llama 3 template builds, apart from the instruction/input join; unread columns named."""
from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import SMOKE, run_cli
from llama_npu.model.tokens import IGNORE_ID

SYSTEM = "你是一个乐于助人的助手。"
# alpaca records as LLaMA-Factory's README lays them out, with a column nothing reads ('source')
ALPACA = [
    {"instruction": "它有多长？", "input": "", "output": "两万多公里。", "system": SYSTEM, "source": "自制",
     "history": [["你好", "你好！有什么可以帮你？"], ["长城在哪里？", "长城在中国北方。"]]},
    {"instruction": "把下面的句子翻译成英文", "input": "我爱北京", "output": "I love Beijing.", "system": "",
     "source": "自制", "history": []},
]
# the sharegpt layout: a `system` column beside the turns, and an unread 'id'
SHAREGPT = [{"id": 1, "system": SYSTEM, "conversations": [
    {"from": "human", "value": "你好"}, {"from": "gpt", "value": "你好！"},
    {"from": "human", "value": "一加一等于几？"}, {"from": "gpt", "value": "等于二。"}]}]

# LLaMA-Factory's Llama 3 template (src/llamafactory/data/template.py, register_template
# name="llama3"): format_prefix the bos_token; format_system
# "<|start_header_id|>system<|end_header_id|>\n\n{{content}}<|eot_id|>"; format_user
# "<|start_header_id|>user<|end_header_id|>\n\n{{content}}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
# format_assistant "{{content}}<|eot_id|>". Its supervised processor (processor/supervised.py)
# masks each turn's source (the prefix and system in the first) and, without mask_history,
# takes every answer as a target.
USER = "<|start_header_id|>user<|end_header_id|>\n\n{}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
SYSTEM_TURN = "<|start_header_id|>system<|end_header_id|>\n\n{}<|eot_id|>"


def encode(tokenizer, text: str) -> list:
    """`text` as the Hugging Face tokenizer LLaMA-Factory calls encodes it: the special tokens
    (added tokens) split out whole, the text between them encoded."""
    pieces = re.split(r"(<\|[a-z_]+\|>)", text)
    return [i for piece in pieces if piece for i in ([tokenizer.token_to_id(piece)] if re.fullmatch(
        r"<\|[a-z_]+\|>", piece) else tokenizer.encode(piece, add_special_tokens=False).ids)]


def llama_factory_ids(tokenizer, system: str, turns) -> tuple[list, list]:
    """(ids, labels) of (query, answer) turns as LLaMA-Factory builds them: each element of
    the template encoded as one string."""
    ids, labels = [], []
    for i, (query, answer) in enumerate(turns):
        source = ("<|begin_of_text|>" + (SYSTEM_TURN.format(system) if system else "") if i == 0 else "")
        source_ids = encode(tokenizer, source + USER.format(query))
        target_ids = encode(tokenizer, f"{answer}<|eot_id|>")
        ids += source_ids + target_ids
        labels += [IGNORE_ID] * len(source_ids) + target_ids
    return ids, labels


def alpaca_turns(record: dict) -> list:
    # LLaMA-Factory joins instruction and input with "\n"; llama-npu with "\n\n" (the documented difference)
    query = "\n\n".join(filter(None, (record["instruction"], record["input"])))
    return [tuple(pair) for pair in record["history"]] + [(query, record["output"])]


def expected(tokenizer) -> dict:
    return {"alpaca": [llama_factory_ids(tokenizer, r["system"], alpaca_turns(r)) for r in ALPACA],
            "sharegpt": [llama_factory_ids(tokenizer, r["system"], [
                (turns[i]["value"], turns[i + 1]["value"]) for i in range(0, len(turns), 2)])
                for r in SHAREGPT for turns in [r["conversations"]]]}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """fmt -> (file, data.columns): the alpaca records as Parquet with their history under a
    name of the lab's own (read through data.columns), the sharegpt ones as a JSON array."""
    root = tmp_path_factory.mktemp("llama_factory")
    parquet = root / "alpaca.parquet"
    pq.write_table(pa.Table.from_pylist([{("对话历史" if k == "history" else k): v for k, v in r.items()}
                                         for r in ALPACA]), parquet)
    (root / "sharegpt.json").write_text(json.dumps(SHAREGPT, ensure_ascii=False), encoding="utf-8")
    return {"alpaca": (parquet, {"history": "对话历史"}), "sharegpt": (root / "sharegpt.json", {})}


@pytest.mark.parametrize("fmt", ["alpaca", "sharegpt"])
def test_train_and_eval_tokenize_llama_factory_layouts_to_its_llama3_ids(fmt, files, capsys):
    from llama_npu.data.source import training_source
    from llama_npu.data.samples import tokenize_records
    from llama_npu.data.tables import ReadOptions
    from llama_npu.data.tokenizer import load_tokenizer
    from llama_npu.evaluation.perplexity import read_eval_records
    from llama_npu.recipe.load import load_recipe

    path, columns = files[fmt]
    recipe = load_recipe(SMOKE, [f"data.format={fmt}", f"data.train_files=[{path}]", "data.eval_files=[]",
                                 f"data.columns={json.dumps(columns, ensure_ascii=False)}", "data.max_seq_len=512"])
    tokenizer = load_tokenizer(recipe.data.tokenizer)
    want = expected(tokenizer)[fmt]
    trained = [(s.input_ids, s.labels) for s in training_source(recipe, tokenizer).samples]
    evaluated = [(s.input_ids, s.labels) for s in tokenize_records(
        tokenizer, read_eval_records([path], ReadOptions.of(columns)), 513)[0]]
    assert trained == want and evaluated == want
    unread = "'source'" if fmt == "alpaca" else "'id'"
    notes = [line for line in capsys.readouterr().out.splitlines() if "not read" in line]
    assert len(notes) == 2 and all(f"{path}: column {unread} not read" in line for line in notes)  # one a reading


def test_history_under_its_own_name_needs_no_map_and_a_bad_one_is_one_line(tmp_path):
    from llama_npu.data.readers import RecordError, read_records

    path = tmp_path / "a.json"
    path.write_text(json.dumps(ALPACA, ensure_ascii=False), encoding="utf-8")
    assert [len(r.messages) for r in read_records([path])] == [7, 2]  # system, 2 history turns, the last
    path.write_text(json.dumps([{**ALPACA[0], "history": [["只有问题"]]}], ensure_ascii=False), encoding="utf-8")
    with pytest.raises(RecordError) as error:
        read_records([path])
    assert str(error.value).startswith(f'{path}:1: history turn 1 must be a [query, response] pair of non-empty '
                                       f'strings, got ["只有问题"]')
    path.write_text(json.dumps([{**ALPACA[0], "tools": '[{"name": "f"}]'}], ensure_ascii=False), encoding="utf-8")
    with pytest.raises(RecordError, match=r":1: field 'tools' holds tool definitions"):
        read_records([path])


def test_eval_data_names_the_unread_column_once(six_step_run, tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(SHAREGPT * 3, ensure_ascii=False), encoding="utf-8")
    proc = run_cli("eval", "--checkpoint", six_step_run[0], "--data", path, "--json", check=True)
    assert proc.stdout.count("not read") == 1 and f"{path}: column 'id' not read" in proc.stdout
    assert json.loads(proc.stdout.splitlines()[-1])["evaluated"] == 3


def test_preference_layouts_read_system_history_and_both_replies(tmp_path):
    """LLaMA-Factory's preference layouts: sharegpt turns ending with the user and `chosen` /
    `rejected` as gpt messages, a `system` column; alpaca with `history`."""
    from llama_npu.objectives.dpo.records import read_pairs

    sharegpt = {"system": SYSTEM, "conversations": [{"from": "human", "value": "你好"}, {"from": "gpt", "value": "你好！"},
                                                    {"from": "human", "value": "一加一等于几？"}],
                "chosen": {"from": "gpt", "value": "等于二。"}, "rejected": {"from": "gpt", "value": "等于三。"}}
    alpaca = {"instruction": "一加一等于几？", "history": [["你好", "你好！"]], "chosen": "等于二。", "rejected": "等于三。"}
    turns = [("user", "你好"), ("assistant", "你好！"), ("user", "一加一等于几？")]
    for fmt, record, prompt in (("sharegpt", sharegpt, [("system", SYSTEM), *turns]), ("alpaca", alpaca, turns)):
        path = tmp_path / f"{fmt}.jsonl"
        path.write_text(json.dumps(record, ensure_ascii=False) + "\n", encoding="utf-8")
        (pair,), _ = read_pairs([path], fmt)
        assert (pair.prompt, pair.chosen, pair.rejected) == (prompt, "等于二。", "等于三。"), fmt
