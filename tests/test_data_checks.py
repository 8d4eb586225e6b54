"""One check of the tokenizer, the data and the recipe for every command, run before
anything is written: what `validate` lists is what `train` stops on."""
import json
import shutil

import pytest
import yaml

from conftest import REPO, SMOKE, TINY_RUN, read_metrics, run_cli

GOOD = {"conversations": [{"from": "human", "value": "长城有多长？"}, {"from": "gpt", "value": "两万多公里。"}]}
NO_VALUE = {"conversations": [{"from": "human", "value": "你好"}, {"from": "gpt"}]}
ENDS_WITH_USER = {"conversations": [{"from": "human", "value": "你好"}]}


@pytest.fixture(scope="module")
def foreign_tokenizer(tmp_path_factory):
    """An 800-token BPE trained on a few sentences, with the Llama 3 special tokens at ids of
    its own (0-4), as a tokenizer.json from some other model has them."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    text = (REPO / "data" / "zh_instruct_train.jsonl").read_text(encoding="utf-8").splitlines()
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=800, special_tokens=specials + ["<unk>"]))
    path = tmp_path_factory.mktemp("foreign") / "tokenizer.json"
    tok.save(str(path))
    return path


def foreign_line(path) -> str:
    return (f"llama-npu: error: tokenizer {path}: <|begin_of_text|> has id 0, but the Llama 3 chat format uses id "
            f"128000 (5 of 5 special tokens differ); use the Llama 3.2 tokenizer")


def test_a_foreign_tokenizer_is_refused_by_validate_prepare_data_and_train(foreign_tokenizer, tmp_path):
    args = [SMOKE, "--output-dir", tmp_path / "run", "--set", f"data.tokenizer={foreign_tokenizer}"]
    for command in ("validate", "train"):
        proc = run_cli(command, *args)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith(foreign_line(foreign_tokenizer))
    proc = run_cli("prepare-data", "--format", "alpaca", "--input", "data/zh_instruct_train.jsonl", "--output",
                   tmp_path / "prepared", "--tokenizer", foreign_tokenizer)
    assert proc.returncode == 2 and proc.stderr.strip().startswith(foreign_line(foreign_tokenizer))
    assert not (tmp_path / "run").exists() and not (tmp_path / "prepared").exists()


def test_eval_refuses_a_run_whose_tokenizer_is_foreign(six_step_run, foreign_tokenizer, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(six_step_run[0], run)
    stored = yaml.safe_load((run / "recipe.yaml").read_text())
    stored["data"]["tokenizer"] = str(foreign_tokenizer)
    (run / "recipe.yaml").write_text(yaml.safe_dump(stored))
    proc = run_cli("eval", "--checkpoint", run, "--data", "data/zh_instruct_eval.jsonl")
    assert proc.returncode == 2 and proc.stderr.strip().startswith(foreign_line(foreign_tokenizer))
    assert "building" not in proc.stdout and "Traceback" not in proc.stderr


def test_a_tokenizer_whose_text_can_leave_the_embedding_is_refused(tmp_path):
    """Llama 3.2's own file has one special token past the 128,256 embeddings (<|image|>),
    which text never becomes; an added ordinary token there would be."""
    from tokenizers import Tokenizer

    from llama_npu.data.tokenizer import TokenizerError, default_tokenizer_path, load_tokenizer

    tok = Tokenizer.from_file(str(default_tokenizer_path()))
    tok.add_tokens(["长城站"])
    tok.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(TokenizerError, match=r"text can become id 128257, but the model embeds 128,256 tokens"):
        load_tokenizer(str(tmp_path / "tokenizer.json"))
    load_tokenizer("llama3.2")  # <|image|> = 128256 is special: accepted


def write_records(path, records, as_array: bool):
    if as_array:  # one key a line, as json.dump(indent=2) writes it: record 11 is not on line 11
        path.write_text(json.dumps(records, ensure_ascii=False, indent=2), encoding="utf-8")
    else:
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def record_lines(path, as_array: bool, indices) -> list:
    """The line each record of `indices` (0-based) starts on."""
    if not as_array:
        return [i + 1 for i in indices]
    starts = [n for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1) if line == "  {"]
    return [starts[i] for i in indices]


# Every bad-record error ends with the way to train on the rest.
SKIP = "data.on_bad_record=skip (prepare-data --on-bad-record skip) drops such records"


@pytest.mark.parametrize("as_array", [False, True], ids=["jsonl", "json-array"])
def test_validate_lists_every_bad_record_train_stops_on_the_first(tmp_path, as_array):
    data = write_records(tmp_path / ("chat.json" if as_array else "chat.jsonl"),
                         [GOOD] * 10 + [NO_VALUE] + [GOOD] * 5 + [ENDS_WITH_USER] + [GOOD] * 5, as_array)
    first, second = record_lines(data, as_array, [10, 16])
    args = [SMOKE, "--output-dir", tmp_path / "run", *TINY_RUN, "--set", "data.format=sharegpt",
            "--set", f"data.train_files=[{data}]"]
    proc = run_cli("validate", *args)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"llama-npu: error: {data}:{first} turn 2: field 'value' is missing; expected a non-empty string; {SKIP}",
        f"llama-npu: error: {data}:{second}: the conversation ends with a user turn; expected it to end with the "
        f"assistant; {SKIP}"]
    proc = run_cli("train", *args)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        f"llama-npu: error: {data}:{first} turn 2: field 'value' is missing; expected a non-empty string; {SKIP} "
        f"(and 1 more: llama-npu validate with the same arguments lists them all)")
    assert not (tmp_path / "run").exists()


def test_on_bad_record_skip_trains_on_the_rest(tmp_path):
    data = write_records(tmp_path / "chat.json", [GOOD] * 10 + [NO_VALUE] + [GOOD] * 5 + [ENDS_WITH_USER], True)
    out = tmp_path / "run"
    proc = run_cli("train", SMOKE, "--output-dir", out, *TINY_RUN, "--set", "train.max_steps=2", "--set",
                   "data.format=sharegpt", "--set", f"data.train_files=[{data}]", "--set", "data.on_bad_record=skip",
                   "--set", "train.global_batch_size=16", check=True)
    assert (f"data.on_bad_record=skip: skipped 2 of 17 records of {data}: 1 x missing 'value' (first at "
            f"{data}:{record_lines(data, True, [10])[0]} turn 2); 1 x no final assistant turn") in proc.stdout
    assert "15 training samples" in proc.stdout and [r["step"] for r in read_metrics(out)] == [1, 2]
    # the 15 samples left are fewer than a step of 16 takes: said, with the numbers
    assert "[llama-npu] warning: the training data gives 15 rows, fewer than the 16 one optimizer step takes" \
        in proc.stderr


def test_twenty_bad_records_are_listed_then_counted_and_json_errors_print_in_full(tmp_path):
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps(GOOD, ensure_ascii=False) + "\n" + "".join(
        json.dumps(NO_VALUE) + "\n" for _ in range(24)) + '{"conversations": "unterminated\n', encoding="utf-8")
    args = [SMOKE, "--set", "data.format=sharegpt", "--set", f"data.train_files=[{data}]", "--set",
            "data.eval_files=[]", "--output-dir", tmp_path / "run"]
    proc = run_cli("validate", *args)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 21
    assert lines[0] == (f"llama-npu: error: {data}:2 turn 2: field 'value' is missing; expected a non-empty string; "
                        f"{SKIP}")
    assert lines[20] == ("llama-npu: error: data: 5 more bad records (25 in all); fix them, or set "
                         "data.on_bad_record: skip to train on the rest")
    proc = run_cli("validate", *args, "--set", "data.on_bad_record=skip")
    assert proc.returncode == 0, proc.stderr
    from llama_npu.data.readers import RecordError, iter_records

    errors = [e for e in iter_records([data], "sharegpt") if isinstance(e, RecordError)]
    assert str(errors[-1]) == (f"{data}:26:19: malformed JSON (Unterminated string starting at column 19); "
                               f"expected one object per line")


def test_validate_lists_every_problem_of_the_recipe_file_once(tmp_path):
    recipe = tmp_path / "four.yaml"
    recipe.write_text("model: {preset: tiny}\ndata:\n  train_files: [data/zh_instruct_train.jsonl]\n  formt: alpaca\n"
                      "train:\n  max_steps: -3\n  micro_batch_size: abc\nstrategies:\n  precision: {amp_level: O5}\n")
    proc = run_cli("validate", recipe, "--output-dir", tmp_path / "run")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "llama-npu: error: unknown key 'data.formt' (did you mean 'data.format'?)",
        "llama-npu: error: train.micro_batch_size: expected an integer, got 'abc'",
        "llama-npu: error: train.max_steps: expected a value > 0, got -3",
        "llama-npu: error: strategies.precision.amp_level: expected one of O0, O1, O2, O3, got 'O5'"]
    proc = run_cli("train", recipe, "--output-dir", tmp_path / "run")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        "llama-npu: error: unknown key 'data.formt' (did you mean 'data.format'?) (and 3 more: llama-npu validate "
        "with the same arguments lists them all)")


def test_validate_checks_the_default_output_directory_and_the_process_count(tmp_path):
    """No --output-dir: runs/<recipe name> under the current directory, as train writes; no
    --workers: one process, as a plain `train` has."""
    recipe = tmp_path / "mine.yaml"
    recipe.write_text(SMOKE.read_text())
    (tmp_path / "runs" / "mine").mkdir(parents=True)
    (tmp_path / "runs" / "mine" / "notes.txt").write_text("kept")
    data = [f"data.train_files=[{REPO / 'data' / 'zh_instruct_train.jsonl'}]",
            f"data.eval_files=[{REPO / 'data' / 'zh_instruct_eval.jsonl'}]"]
    sets = [a for s in data + ["strategies.parallel.data=2"] for a in ("--set", s)]
    proc = run_cli("validate", recipe, *sets, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "llama-npu: error: strategies.parallel: data 2 x model 1 x pipeline 1 = 2 workers, but 1 is running; launch "
        "it with scripts/launch.sh RECIPE 2 (validate it with --workers 2)",
        "llama-npu: error: output directory runs/mine is not empty; pass --resume auto to continue it or "
        "--overwrite to start again"]
    assert run_cli("validate", recipe, *sets, "--workers", "2", "--overwrite", cwd=tmp_path).returncode == 0


def test_a_rehearsal_lists_each_problem_once(tmp_path):
    proc = run_cli("validate", "recipes/llama3_2_1b_zh_full_910a.yaml", "--rehearse", "--output-dir",
                   tmp_path / "run", "--set", f"data.train_files=[{tmp_path / 'gone.jsonl'}]")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"llama-npu: error: {tmp_path / 'gone.jsonl'}: file not found"]


def test_doctor_does_not_say_runs_here_for_a_recipe_that_reads_its_data_wrong(tmp_path):
    (tmp_path / "wrong.yaml").write_text(SMOKE.read_text().replace("format: alpaca", "format: sharegpt"))
    proc = run_cli("doctor", "--recipes", tmp_path)
    line = next(line for line in proc.stdout.splitlines() if "wrong.yaml" in line)
    assert "runs here" not in line and ("cannot start: data.format=sharegpt: no record of "
                                        "data/zh_instruct_train.jsonl parses") in line
    assert "'instruction', an alpaca field" in line


def test_eval_reads_every_layout_train_reads_to_the_loss_of_the_jsonl(six_step_run, tmp_path):
    """JSON array, CSV, TSV, .xlsx and Parquet copies of held-out records: evaluated together,
    their loss per target token and their counts are the JSONL's five times over."""
    from conftest import write_layouts

    records = [json.loads(line) for line in (REPO / "data" / "zh_instruct_eval.jsonl").read_text().splitlines()[:6]]
    paths = write_layouts(records, tmp_path)
    jsonl = json.loads(run_cli("eval", "--checkpoint", six_step_run[0], "--data", paths[".jsonl"], "--json",
                               check=True).stdout.splitlines()[-1])
    others = [paths[s] for s in (".json", ".csv", ".tsv", ".xlsx", ".parquet")]
    every = json.loads(run_cli("eval", "--checkpoint", six_step_run[0], "--data", *others, "--json",
                               check=True).stdout.splitlines()[-1])
    assert jsonl["records"] == 6 and (every["records"], every["target_tokens"]) == (30, 5 * jsonl["target_tokens"])
    assert every["loss"] == pytest.approx(jsonl["loss"], rel=1e-5)
