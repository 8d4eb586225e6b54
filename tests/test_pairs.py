"""Preference pairs (train.objective: dpo): both layouts read, every bad pair named once by
file:line, long pairs cut or dropped and counted, and the 2P rows of a batch in TRL's order
with only the reply tokens as targets."""
import json

import pytest
import yaml

from conftest import REPO, SMOKE, run_cli
from llama_npu.data.chat_template import render_text
from llama_npu.data.readers import RecordError, iter_records
from llama_npu.data.tokenizer import load_tokenizer
from llama_npu.model.tokens import IGNORE_ID, PAD_ID
from llama_npu.objectives import dpo, records_of, sft
from llama_npu.objectives.dpo.pairs import pad_pair_batch, tokenize_pairs
from llama_npu.objectives.dpo.records import PairRecord, read_pairs
from llama_npu.recipe.load import recipe_from_dict
from llama_npu.recipe.problems import RecipeError
from llama_npu.training.preflight import preflight

SKIP = "data.on_bad_record: skip drops such pairs"
GOOD = {"instruction": "长城有多长？", "chosen": "两万多公里。", "rejected": "三米左右。"}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("llama3.2")


@pytest.fixture(scope="module")
def rendered_length():
    """Tokens of the chat format's rendered text, the markers read by the plain tokenizer
    (the checked one keeps marker text in user data as text)."""
    from tokenizers import Tokenizer

    from llama_npu.data.tokenizer import default_tokenizer_path

    plain = Tokenizer.from_file(str(default_tokenizer_path()))
    return lambda text: len(plain.encode(text, add_special_tokens=False).ids)


ASSISTANT = "<|start_header_id|>assistant<|end_header_id|>\n\n"


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def test_both_layouts_read_as_prompt_and_two_replies(tmp_path):
    alpaca = tmp_path / "alpaca.json"  # a JSON array: records named by the line they start on
    alpaca.write_text(json.dumps([GOOD, {"system": "你是导游。", "instruction": "推荐一个景点", "input": "在西安",
                                         "chosen": {"role": "assistant", "content": "兵马俑。"},
                                         "rejected": "不知道。"}], ensure_ascii=False, indent=2), encoding="utf-8")
    sharegpt = write_jsonl(tmp_path / "chat.jsonl", [
        {"conversations": [{"from": "system", "value": "简洁作答。"}, {"from": "human", "value": "1+1=?"},
                           {"from": "gpt", "value": "2"}, {"from": "human", "value": "再加1呢？"}],
         "chosen": {"from": "gpt", "value": "3"}, "rejected": {"from": "gpt", "value": "11"}},
        {"messages": [{"role": "user", "content": "你好"}], "chosen": "你好！有什么可以帮你？", "rejected": "嗯。"}])
    assert read_pairs([alpaca], "alpaca")[0] == [
        PairRecord(f"{alpaca}:2", [("user", "长城有多长？")], "两万多公里。", "三米左右。"),
        PairRecord(f"{alpaca}:7", [("system", "你是导游。"), ("user", "推荐一个景点\n\n在西安")], "兵马俑。", "不知道。")]
    assert read_pairs([sharegpt], "sharegpt")[0] == [
        PairRecord(f"{sharegpt}:1", [("system", "简洁作答。"), ("user", "1+1=?"), ("assistant", "2"),
                                     ("user", "再加1呢？")], "3", "11"),
        PairRecord(f"{sharegpt}:2", [("user", "你好")], "你好！有什么可以帮你？", "嗯。")]
    answered = write_jsonl(tmp_path / "answered.jsonl", [{"conversations": [
        {"from": "human", "value": "你好"}, {"from": "gpt", "value": "你好！"}], "chosen": "a", "rejected": "b"}])
    [error] = list(iter_records([answered], "sharegpt", kind=dpo.OBJECTIVE.RECORDS))
    assert str(error) == (f"{answered}:1: the conversation ends with an assistant turn; expected it to end with the "
                          f"user, whom 'chosen' and 'rejected' answer")


def test_a_pair_read_as_sft_data_names_the_objective(tmp_path):
    data = write_jsonl(tmp_path / "pairs.jsonl", [GOOD])
    [error] = list(iter_records([data], "alpaca", kind=records_of(sft.OBJECTIVE)))
    assert str(error) == (f"{data}:1: the record is a preference pair ('chosen' and 'rejected'), read as SFT data: "
                          f"pairs train with train.objective: dpo, from data.train_files")


def test_validate_names_every_bad_pair_once_with_its_line(tmp_path, rendered_length):
    long_prompt = "请详细解释" * 40  # well over 32 tokens
    prompt_tokens = rendered_length(render_text([("user", long_prompt)]) + ASSISTANT)
    data = write_jsonl(tmp_path / "pairs.jsonl", [
        GOOD, {"instruction": "你好", "chosen": "你好！"},  # 2: no rejected
        {"instruction": "你好", "chosen": "你好！", "rejected": "  "},  # 3: empty rejected
        {"instruction": "你好", "chosen": "你好！", "rejected": "你好！ "},  # 4: the same reply
        {"instruction": long_prompt, "chosen": "好的。", "rejected": "不。"},  # 5: no room for a reply
        {"conversations": [{"from": "human", "value": "hi"}], "chosen": "a", "rejected": "b"},  # 6: sharegpt
        {"instruction": "你好", "output": "你好！"}, GOOD])  # 7: an SFT record
    args = [SMOKE, "--set", "train.objective=dpo", "--set", f"data.train_files=[{data}]", "--set",
            "data.eval_files=[]", "--set", "data.max_seq_len=32", "--set", "data.truncation=keep_prompt",
            "--output-dir", tmp_path / "run"]
    proc = run_cli("validate", *args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"llama-npu: error: {line}" for line in [
        f"{data}:2: field 'rejected' is missing; expected a non-empty string (the record has 'instruction', "
        f"'chosen'; data.columns: {{rejected: NAME}} reads it from another); {SKIP}",
        f"{data}:3: field 'rejected' is empty; expected a non-empty string; {SKIP}",
        f"{data}:4: 'chosen' equals 'rejected'; a pair needs two different replies; {SKIP}",
        f"{data}:6: read as alpaca, but the record has 'conversations', a sharegpt field: set data.format: sharegpt "
        f"in the recipe (prepare-data: --format sharegpt)",
        f"{data}:7: not a preference pair: train.objective: dpo expects 'chosen' and 'rejected' replies; {SKIP}",
        f"{data}:5: the prompt takes {prompt_tokens} tokens, which leaves no room for a reply within "
        f"data.max_seq_len=32 under data.truncation: keep_prompt; shorten it, raise data.max_seq_len or set "
        f"data.truncation: keep_end; {SKIP}"]]
    assert not (tmp_path / "run").exists()
    recipe = recipe_from_dict(yaml.safe_load(SMOKE.read_text()), [a for a in args[1:-2] if a != "--set"])
    assert preflight(recipe, None, None, False)[0]  # the same problems in process, and with skip none:
    recipe.data.on_bad_record = "skip"
    assert preflight(recipe, None, None, False)[0] == []
    recipe.data.on_bad_record, recipe.data.truncation = "error", "keep_end"  # the prompt cut: no problem of length
    assert not any("no room" in problem for problem in preflight(recipe, None, None, False)[0])


def test_dpo_refuses_sft_only_data_and_packing():
    tree = yaml.safe_load(SMOKE.read_text())
    sft_only = recipe_from_dict(tree, ["train.objective=dpo", "data.eval_files=[]"])
    assert preflight(sft_only, None, None, False)[0] == [
        "train.objective=dpo: data/zh_instruct_train.jsonl holds no preference pair (no record has 'chosen' and "
        "'rejected'); DPO trains on pairs, SFT records train with train.objective: sft"]
    with pytest.raises(RecipeError) as refused:
        recipe_from_dict(yaml.safe_load(SMOKE.read_text()), ["train.objective=dpo", "data.pack=true",
                                                             "dpo.on_long_pair=cut", "data.eval_files=[]"])
    assert refused.value.problems == [
        "dpo.on_long_pair: expected one of truncate, drop, got 'cut'",
        "data.pack: true with train.objective: dpo; a pair's chosen and rejected rows are scored one sequence a "
        "row, so DPO data is not packed: set data.pack: false"]


def pair(where, prompt, chosen, rejected):
    return PairRecord(where, [("user", prompt)], chosen, rejected)


def test_long_pairs_are_truncated_or_dropped_and_counted(tokenizer, rendered_length):
    records = [pair("a:1", "你好", "你好！", "嗯。"), pair("a:2", "讲个故事", "从前有座山，" * 20, "不讲。"),
               pair("a:3", "讲个故事" * 30, "好。", "不。"), pair("a:4", "写首诗", "短诗。", "床前明月光，" * 20)]
    cut, report = tokenize_pairs(tokenizer, records, 40, "keep_prompt")
    assert (report.read, report.kept, report.truncated, report.dropped) == (4, 3, 2, 1)
    assert [where for where, _ in report.no_room] == ["a:3"]
    whole = rendered_length(render_text([("user", "写首诗"), ("assistant", "短诗。")]))
    assert [len(p.chosen.input_ids) for p in cut[1:]] == [40, whole] and len(cut[2].rejected.input_ids) == 40
    assert cut[1].chosen.labels[-1] != tokenizer.token_to_id("<|eot_id|>")  # cut mid-reply
    dropped, report = tokenize_pairs(tokenizer, records, 40, "drop")
    assert (report.read, report.kept, report.truncated, report.dropped) == (4, 1, 0, 3)
    assert dropped == cut[:1]


def test_a_batch_is_the_chosen_rows_then_the_rejected_with_only_replies_as_targets(tokenizer):
    records = [pair("a:1", "长城有多长？", "两万多公里。", "三米。"), pair("a:2", "你好", "你好！有什么可以帮你？", "滚。")]
    pairs, _ = tokenize_pairs(tokenizer, records, 64)
    ids, labels = pad_pair_batch(pairs, 48, PAD_ID)
    assert ids.shape == labels.shape == (4, 48)
    replies = ["两万多公里。", "你好！有什么可以帮你？", "三米。", "滚。"]  # chosen 0, chosen 1, rejected 0, rejected 1
    for row, reply in enumerate(replies):
        targets = [int(t) for t in labels[row] if t != IGNORE_ID]
        assert tokenizer.decode(targets, skip_special_tokens=False) == reply + "<|eot_id|>"
        start = list(labels[row]).index(targets[0])
        assert list(ids[row, start:start + len(targets)]) == targets  # a target is the token at its position
        assert tokenizer.decode(list(ids[row, :start]), skip_special_tokens=False).endswith(
            "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert list(ids[0, :10]) == list(ids[2, :10])  # a pair's two rows share the prompt


def test_the_shipped_preference_sample_reads_whole_and_holds_out_its_eval_prompts(tokenizer):
    train, skipped = read_pairs([REPO / "data" / "zh_pref_train.jsonl"], "alpaca", "skip")
    held_out, eval_skipped = read_pairs([REPO / "data" / "zh_pref_eval.jsonl"], "alpaca", "skip")
    chat, chat_skipped = read_pairs([REPO / "data" / "zh_pref_chat.jsonl"], "sharegpt", "skip")
    assert skipped.total == eval_skipped.total == chat_skipped.total == 0
    assert (len(train), len(held_out)) == (200, 30) and len(chat) >= 20
    prompts = [tuple(r.prompt) for r in train]
    assert len(set(prompts)) == len(prompts) and not set(prompts) & {tuple(r.prompt) for r in held_out}
    assert len({r.rejected for r in train}) == len(train)  # each worse reply written for its prompt
    _, report = tokenize_pairs(tokenizer, train + held_out + chat, 1025)
    assert report.kept == len(train) + len(held_out) + len(chat) and report.truncated == 0


def test_a_run_reads_its_pairs_counting_what_it_left_out(tmp_path, tokenizer, capsys):
    from llama_npu.data.dataset_info import files_input
    from llama_npu.objectives.dpo.source import pair_samples

    data = write_jsonl(tmp_path / "pairs.jsonl", [
        GOOD, {"instruction": "你好", "chosen": "你好！", "rejected": "你好！"},  # 2: skipped
        {"instruction": "请详细解释" * 40, "chosen": "好的。", "rejected": "不。"},  # 3: no room
        {"instruction": "写首诗", "chosen": "短诗。", "rejected": "床前明月光，" * 20}])  # 4: too long
    recipe = recipe_from_dict(yaml.safe_load(SMOKE.read_text()), [
        "train.objective=dpo", "data.max_seq_len=32", "data.on_bad_record=skip", "data.truncation=drop",
        "data.eval_files=[]"])
    assert [p.chosen.input_ids for p in pair_samples(recipe, tokenizer, [files_input(recipe.data, [data])])] == [
        p.chosen.input_ids for p in tokenize_pairs(tokenizer, read_pairs([data], "alpaca", "skip")[0][:1], 33)[0]]
    assert (f"skipped 1 of 4 records of {data}: 1 x chosen equal to rejected (first at {data}:2)\n"
            f"[llama-npu] {data}: 0 of 3 preference pairs truncated, 2 dropped (data.truncation: drop, rows of 33 "
            f"tokens)") in capsys.readouterr().out
    # under keep_prompt a prompt that fills the row is a bad record: validate has named it, and
    # a run without that check still stops on it
    recipe.data.on_bad_record, recipe.data.truncation = "error", "keep_prompt"
    long_prompt = write_jsonl(tmp_path / "long.jsonl", [GOOD, {"instruction": "请详细解释" * 40, "chosen": "好的。",
                                                               "rejected": "不。"}])
    with pytest.raises(RecordError, match=rf"^{long_prompt}:2: the prompt takes \d+ tokens, which leaves no room"):
        pair_samples(recipe, tokenizer, [files_input(recipe.data, [long_prompt])])


@pytest.mark.parametrize("suffix", [".csv", ".xlsx"])
def test_pairs_from_a_spreadsheet_by_data_columns_validate_and_equal_their_jsonl_form(tmp_path, tokenizer, suffix,
                                                                                      capsys):
    """A lab's pairs in a spreadsheet with its own headers (data/tables.py), data.columns
    mapping chosen and rejected too: validate accepts the recipe, and the run's tokenized
    pairs are the JSONL form's, row for row."""
    from llama_npu.cli import build_parser
    from llama_npu.data.dataset_info import files_input
    from llama_npu.objectives.dpo.source import pair_samples
    from test_tables import write_table

    shipped = [json.loads(line) for line in (REPO / "data" / "zh_pref_train.jsonl").read_text().splitlines()[:6]]
    keys = ["instruction", "input", "chosen", "rejected"]  # replies over several lines, empty inputs
    header = ["问题", "补充", "较好的回答", "较差的回答"]
    table = write_table(tmp_path / f"偏好{suffix}", header, [[r.get(k, "") for k in keys] for r in shipped])
    twin = write_jsonl(tmp_path / "pairs.jsonl", shipped)
    columns = "data.columns={" + ", ".join(f"{k}: {h}" for k, h in zip(keys, header)) + "}"
    dpo_smoke = REPO / "recipes" / "cpu_dpo_smoke.yaml"
    args = build_parser().parse_args(["validate", str(dpo_smoke), "--output-dir", str(tmp_path / "run"), "--set",
                                      f"data.train_files=[{table}]", "--set", columns])
    assert args.func(args) == 0, capsys.readouterr().err
    recipe = recipe_from_dict(yaml.safe_load(dpo_smoke.read_text()), [columns])
    from_table, from_jsonl = (pair_samples(recipe, tokenizer, [files_input(recipe.data, [path])])
                              for path in (table, twin))
    assert len(from_table) == 6 and [(p.chosen, p.rejected) for p in from_table] == [
        (p.chosen, p.rejected) for p in from_jsonl]
