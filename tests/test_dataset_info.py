"""A LLaMA-Factory user's dataset_info.json, column and tag names and KTO labels, read as
LLaMA-Factory reads them (src/llamafactory/data/parser.py, converter.py, loader.py): what
trains, and the one line for what cannot."""
import json

import pytest

from llama_npu.data.errors import RecordError
from llama_npu.objectives import named, records_of
from llama_npu.recipe.load import load_recipe
from llama_npu.recipe.problems import RecipeError

from conftest import REPO, run_cli

RECIPE = REPO / "recipes" / "cpu_llamafactory_smoke.yaml"
ALPACA = [{"instruction": "一加一等于几？", "input": "请只写数字", "output": "二", "system": "你是老师"},
          {"instruction": "天空是什么颜色？", "input": "", "output": "蓝色"}]


def write_json(path, value):
    path.write_text(json.dumps(value, ensure_ascii=False), encoding="utf-8")
    return path


def folder(tmp_path, entries: dict, files: dict):
    """A dataset_dir holding `files` (name -> records) and a dataset_info.json of `entries`."""
    for name, records in files.items():
        write_json(tmp_path / name, records)
    write_json(tmp_path / "dataset_info.json", entries)
    return tmp_path


def recipe(*sets, objective="sft"):
    return load_recipe(RECIPE, [f"train.objective={objective}", *sets])


def train_inputs(r):
    from llama_npu.data.dataset_info import train_inputs as inputs  # here: each test fails on main by itself

    return inputs(r)


def records(r):
    from llama_npu.data.source import read_records

    return read_records(r, train_inputs(r), records_of(named(r.train.objective)))


def refused(*sets, objective="sft") -> list:
    with pytest.raises(RecipeError) as caught:
        recipe(*sets, objective=objective)
    return caught.value.problems


def test_a_comma_separated_dataset_is_split_and_stripped_and_formattings_mix():
    r = recipe("data.dataset=' zh_alpaca_demo ,zh_sharegpt_demo'")
    assert [i.name for i in train_inputs(r)] == ["zh_alpaca_demo", "zh_sharegpt_demo"]
    assert [i.format for i in train_inputs(r)] == ["alpaca", "sharegpt"]
    read = records(r)
    assert len(read) == 70  # 40 alpaca + 30 sharegpt records, their "tools": "[]" no tools
    assert read[40].messages[0][0] == "user" and read[40].messages[-1][0] == "assistant"


@pytest.mark.parametrize("entry, line", [
    ({"hf_hub_url": "llamafactory/alpaca_zh"}, "dataset_info.json entry 'x': hf_hub_url names data to download"),
    ({"file_name": "a.json", "ms_hub_url": "m/a"}, "dataset_info.json entry 'x': ms_hub_url names data to download"),
    ({"script_url": "s"}, "dataset_info.json entry 'x': script_url names data to download"),
    ({"cloud_file_name": "s3://b/a.json"}, "dataset_info.json entry 'x': cloud_file_name names data to download"),
    ({"file_name": "a.json", "formatting": "chatml"},
     "dataset_info.json entry 'x': formatting 'chatml'; expected one of alpaca, sharegpt, openai"),
    ({"file_name": "a.json", "split": "test"}, "dataset_info.json entry 'x': split 'test'; a local file has only"),
    ({"file_name": "a.json", "columns": {"prompt": "instruction", "images": "images"}},
     "dataset_info.json entry 'x': columns.images: images columns are multimodal data, which llama-npu does not train"),
    ({"file_name": "a.json", "ranking": True}, "dataset_info.json entry 'x': ranking: true is preference pairs"),
    ({"file_name": "a.json", "tags": {"role_tag": "role", "speaker_tag": "s"}},
     "dataset_info.json entry 'x': tags.speaker_tag: unknown tag; expected one of role_tag"),
])
def test_what_cannot_be_honoured_is_one_line_naming_the_entry_and_the_key(tmp_path, entry, line):
    d = folder(tmp_path, {"x": entry}, {"a.json": ALPACA})
    problems = refused(f"data.dataset_dir={d}", "data.dataset=x")
    assert len(problems) == 1 and problems[0].startswith(line), problems


def test_an_unknown_name_lists_the_local_entries_and_exits_2(tmp_path):
    d = folder(tmp_path, {"a": {"file_name": "a.json"}, "hub": {"hf_hub_url": "x/y"}}, {"a.json": ALPACA})
    proc = run_cli("validate", RECIPE, "--set", f"data.dataset_dir={d}", "--set", "data.dataset=a,b")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"llama-npu: error: data.dataset: no entry 'b' in {d}/dataset_info.json; its "
                                   f"entries with a local file_name: a")


@pytest.mark.parametrize("extra, named_keys", [
    ("data.train_files=[data/zh_instruct_train.jsonl]", "data.train_files"),
    ("data.format=sharegpt", "data.format"),
    ("data.columns={prompt: q}", "data.columns"),
    ("data.tags={role_tag: role, content_tag: content}", "data.tags"),
])
def test_dataset_with_the_keys_an_entry_brings_itself_is_one_line(extra, named_keys):
    assert refused(extra) == [f"data.dataset names dataset_info.json entries, which bring their own files, formatting, "
                              f"columns and tags: remove {named_keys}"]


def test_ranking_must_match_the_objective():
    assert refused("data.dataset=zh_alpaca_demo", objective="dpo") == [
        "dataset_info.json entry 'zh_alpaca_demo': no ranking: true; train.objective: dpo trains on ranking entries "
        "(preference pairs)"]
    assert refused("data.dataset=zh_dpo_demo", objective="kto")[0].startswith(
        "dataset_info.json entry 'zh_dpo_demo': ranking: true is preference pairs")


def test_a_columns_object_leaves_what_it_omits_unread(tmp_path):
    """parser.py: `columns` sets every name it omits to None; without it only prompt, query,
    response and messages are read (so neither map reads the `system` column)."""
    d = folder(tmp_path, {"mapped": {"file_name": "a.json", "columns": {"prompt": "instruction", "response": "output"}},
                          "plain": {"file_name": "a.json"},
                          "with_system": {"file_name": "a.json", "columns": {"prompt": "instruction", "query": "input",
                                                                             "response": "output", "system": "system"}}},
               {"a.json": ALPACA})
    mapped, plain, with_system = (records(recipe(f"data.dataset_dir={d}", f"data.dataset={n}"))[0].messages
                                  for n in ("mapped", "plain", "with_system"))
    assert mapped == [("user", "一加一等于几？"), ("assistant", "二")]
    assert plain == [("user", "一加一等于几？\n\n请只写数字"), ("assistant", "二")]
    assert with_system == [("system", "你是老师")] + plain


def test_a_folder_of_one_type_is_read_and_num_samples_and_max_samples_apply(tmp_path):
    (tmp_path / "parts").mkdir()
    for i in range(3):
        write_json(tmp_path / "parts" / f"{i}.json", [{"instruction": f"问{i}-{j}", "output": "答"} for j in range(4)])
    d = folder(tmp_path, {"all": {"file_name": "parts"}, "some": {"file_name": "parts", "num_samples": 20}}, {})
    assert [m.messages[0][1] for m in records(recipe(f"data.dataset_dir={d}", "data.dataset=all"))][:5] == [
        "问0-0", "问0-1", "问0-2", "问0-3", "问1-0"]
    assert len(records(recipe(f"data.dataset_dir={d}", "data.dataset=some"))) == 20  # 12 records, some drawn twice
    assert len(records(recipe(f"data.dataset_dir={d}", "data.dataset=all,some", "data.max_samples=5"))) == 10
    write_json(tmp_path / "parts" / "3.csv", [])
    assert refused(f"data.dataset_dir={d}", "data.dataset=all") == [
        "dataset_info.json entry 'all': file_name parts: its files are of 2 types (csv, json); a folder's files must "
        "share one"]


def test_an_unknown_data_columns_key_is_refused_listing_the_known_ones():
    proc = run_cli("validate", REPO / "recipes" / "cpu_smoke.yaml", "--set", "data.columns={bogus: x}")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "llama-npu: error: data.columns (data.format=alpaca, train.objective=sft).bogus: unknown column key; expected "
        "one of history, input, instruction, output, prompt, query, response, system, tools")
    kto = refused("data.dataset=[]", "data.train_files=[data/zh_kto_train.jsonl]", "data.columns={images: img}",
                  objective="kto")
    assert kto == ["data.columns (data.format=alpaca, train.objective=kto).images: images columns are multimodal "
                   "data, which llama-npu does not train (text only)"]


def sharegpt_recipe(tmp_path, rows, *sets, objective="sft"):
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return load_recipe(RECIPE, ["data.dataset=[]", f"data.train_files=[{path}]", "data.format=sharegpt",
                                f"train.objective={objective}", *sets]), path


def test_llama_factory_messages_map_over_from_value_turns_reads_them(tmp_path):
    """{messages: conversations} is LLaMA-Factory's default; the turns' own keys decide."""
    turns = [{"from": "human", "value": "你好"}, {"from": "gpt", "value": "你好！"}]
    r, _ = sharegpt_recipe(tmp_path, [{"conversations": turns}], "data.columns={messages: conversations}")
    assert records(r)[0].messages == [("user", "你好"), ("assistant", "你好！")]


def test_data_tags_read_turns_by_llama_factorys_tag_names(tmp_path):
    turns = [{"speaker": "系统", "text": "简短回答"}, {"speaker": "用户", "text": "你好"}, {"speaker": "助手", "text": "嗯"}]
    tags = "data.tags={role_tag: speaker, content_tag: text, user_tag: 用户, assistant_tag: 助手, system_tag: 系统}"
    r, _ = sharegpt_recipe(tmp_path, [{"messages": turns}], tags)
    assert records(r)[0].messages == [("system", "简短回答"), ("user", "你好"), ("assistant", "嗯")]
    # a tags object leaves what it omits unset: without system_tag the system turn is no known role
    r, path = sharegpt_recipe(tmp_path, [{"messages": turns}], tags.replace(", system_tag: 系统", ""))
    with pytest.raises(RecordError) as caught:
        records(r)
    assert str(caught.value).startswith(f"{path}:1 turn 1: unknown role '系统'; expected one of 用户, 助手")


def test_tools_as_empty_json_text_is_no_tools_and_function_calling_stays_a_bad_record(tmp_path, capsys):
    chat = [{"from": "human", "value": "几点了？"}, {"from": "gpt", "value": "三点。"}]
    call = [{"from": "human", "value": "查天气"}, {"from": "function_call", "value": "{}"},
            {"from": "observation", "value": "晴"}, {"from": "gpt", "value": "晴天。"}]
    openai_call = [{"role": "user", "content": "查天气"},
                   {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "weather"}}]}]
    rows = [{"conversations": chat, "tools": "[]"}, {"conversations": chat, "tools": '[{"name": "clock"}]'},
            {"conversations": call, "tools": "[]"}, {"messages": openai_call}]
    r, path = sharegpt_recipe(tmp_path, rows, "data.on_bad_record=skip")
    assert [rec.where for rec in records(r)] == [f"{path}:1"]
    noted = capsys.readouterr().out
    assert f"skipped 3 of 4 records of {path}: 1 x tool definitions (first at {path}:2); 2 x function calling " \
           f"(first at {path}:3 turn 2, {path}:4 turn 2)" in noted


def kto_rows(*labels):
    return [{"instruction": f"问题{i}", "output": f"回答{i}", "评价": label} for i, label in enumerate(labels)]


def test_kto_labels_read_by_data_label_values_and_a_value_outside_is_a_bad_record(tmp_path, capsys):
    path = tmp_path / "kto.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kto_rows("👍", "👎", "好", "差", "一般")),
                    encoding="utf-8")
    base = ["data.dataset=[]", f"data.train_files=[{path}]", "data.columns={kto_tag: 评价}"]
    with pytest.raises(RecordError) as caught:
        records(load_recipe(RECIPE, [*base, "train.objective=kto"]))
    assert str(caught.value).startswith(
        f"{path}:3: column '评价' holds '好'; expected a desirable value (true, 1, yes, 👍) or an undesirable one "
        f"(false, 0, no, 👎), in any case (data.label_values)")
    r = load_recipe(RECIPE, [*base, "train.objective=kto", "data.on_bad_record=skip",
                             "data.label_values={desirable: [好, 👍], undesirable: [差, 👎]}"])
    assert [rec.desirable for rec in records(r)] == [True, False, True, False]
    assert f"skipped 1 of 5 records of {path}: 1 x label not in data.label_values (first at {path}:5)" \
        in capsys.readouterr().out
    assert refused("data.label_values={desirable: [好], undesirable: [好]}", "data.dataset=zh_kto_demo",
                   objective="kto") == ["data.label_values: 好 is both desirable and undesirable"]


def test_eval_dataset_is_not_result_changing_on_resume():
    from llama_npu.recipe.resume_checks import changes_result
    from llama_npu.training.preflight import RESULT_KEYS

    assert not changes_result("data.eval_dataset", RESULT_KEYS) and changes_result("data.dataset", RESULT_KEYS)


def test_eval_takes_the_runs_on_bad_record_and_the_flag(six_step_run, tmp_path):
    """eval stops at a bad record naming file and line (the run's data.on_bad_record: error),
    or, with --on-bad-record skip, scores the rest and names the skipped, as train does."""
    path = tmp_path / "held_out.jsonl"
    good = [{"instruction": "一加一等于几？", "output": "二。"}] * 3
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in good[:2] + [{"instruction": "空"}]
                            + good[2:]), encoding="utf-8")
    run = six_step_run[0]
    stopped = run_cli("eval", "--checkpoint", run, "--data", path)
    assert stopped.returncode == 2 and f"{path}:3: field 'output' is missing" in stopped.stderr
    skipped = run_cli("eval", "--checkpoint", run, "--data", path, "--on-bad-record", "skip", "--json")
    assert skipped.returncode == 0, skipped.stderr
    assert json.loads(skipped.stdout.splitlines()[-1])["records"] == 3
    assert f"--on-bad-record skip: skipped 1 of 4 records of {path}: 1 x missing 'output' (first at {path}:3)" \
        in skipped.stdout
