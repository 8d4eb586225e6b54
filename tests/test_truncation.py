"""data.truncation: what each mode keeps of a long SFT conversation, DPO pair and KTO record,
token for token, built here from the pieces of the Llama 3 chat format; the lines a run
prints for each file; dpo.on_long_pair read as the new key; prepared data made under another
mode refused; and a run directory older than the key resumed as it started (keep_prompt)."""
import json

import pytest
import yaml

from conftest import SMOKE, run_cli
from llama_npu.data.chat_template import role_headers
from llama_npu.data.readers import Record
from llama_npu.data.samples import tokenize_records
from llama_npu.data.tokenizer import load_tokenizer
from llama_npu.data.truncation import infer_seqlen, reply_share
from llama_npu.model.tokens import BOS_ID, EOT_ID, IGNORE_ID
from llama_npu.objectives.dpo.pairs import tokenize_pairs
from llama_npu.objectives.dpo.records import PairRecord
from llama_npu.objectives.kto.records import KtoRecord
from llama_npu.objectives.kto.replies import tokenize_kto
from llama_npu.recipe.load import recipe_from_dict
from llama_npu.recipe.problems import RecipeError
from llama_npu.recipe.stored import stored_recipe

SYSTEM, OLD_Q, OLD_A = "你是一位耐心的老师。", "请介绍一下长城的历史和它的修建过程。" * 2, "长城始建于春秋战国时期，历经多个朝代修建。" * 2
NEW_Q, NEW_A = "那故宫呢？", "故宫是明清两代的皇宫，位于北京中轴线的中心。" * 3


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("llama3.2")


@pytest.fixture(scope="module")
def piece(tok):
    """The chat format's pieces as ids: head (<|begin_of_text|> and the system message), a
    user turn with the assistant header after it, a reply with its <|eot_id|>."""
    h = role_headers(tok)
    enc = lambda text: tok.encode(text, add_special_tokens=False).ids
    return {"head": [BOS_ID] + h["system"] + enc(SYSTEM) + [EOT_ID],
            "turn": lambda q: h["user"] + enc(q) + [EOT_ID] + h["assistant"],
            "reply": lambda a: enc(a) + [EOT_ID]}


def targets(ids, learnt):
    """Labels of `ids` where `learnt` says which tokens are targets."""
    return [t if on else IGNORE_ID for t, on in zip(ids, learnt)]


def test_infer_seqlen_is_llama_factorys_split_and_a_reply_keeps_a_token():
    # processor_utils.py's three branches, by hand: the target whole when under half the
    # cutoff, the source whole when it is, else shared by their lengths
    assert infer_seqlen(100, 20, 64) == (44, 20)
    assert infer_seqlen(20, 100, 64) == (20, 44)
    assert infer_seqlen(100, 100, 64) == (32, 32)
    assert infer_seqlen(10_000, 40, 64) == (64, 0)  # 64 * 40 / 10040 rounds to no reply token
    assert reply_share(10_000, 40, 64) == (63, 1) and reply_share(100, 20, 64) == (44, 20)


def sft_record():
    return Record("a.jsonl:1", messages=[("system", SYSTEM), ("user", OLD_Q), ("assistant", OLD_A), ("user", NEW_Q),
                                         ("assistant", NEW_A)])


def test_sft_keep_end_keeps_the_system_the_latest_turn_and_the_reply_cutting_the_oldest_turns(tok, piece):
    head, older = piece["head"], piece["turn"](OLD_Q) + piece["reply"](OLD_A)
    latest, reply = piece["turn"](NEW_Q), piece["reply"](NEW_A)
    length = len(head) + len(latest) + len(reply) + 7  # 7 tokens of the older turns fit
    [sample], report = tokenize_records(tok, [sft_record()], length, truncation="keep_end")
    assert sample.input_ids == head + older[-7:] + latest + reply
    # the older reply's last tokens stay targets, as every assistant turn is in SFT
    assert sample.labels == targets(sample.input_ids, [0] * len(head) + [1] * 7 + [0] * len(latest) + [1] * len(reply))
    assert (report.read, report.truncated, report.dropped) == (1, 1, 0)
    # shorter still: the latest turn and the reply share the room as infer_seqlen shares it
    room = 30 - len(head)
    kept_turn, kept_reply = infer_seqlen(len(latest), len(reply), room)
    [short], _ = tokenize_records(tok, [sft_record()], 30, truncation="keep_end")
    assert short.input_ids == head + latest[len(latest) - kept_turn:] + reply[:kept_reply]


def test_sft_keep_start_is_llama_factorys_turn_by_turn_split(tok, piece):
    first_source = piece["head"] + piece["turn"](OLD_Q)
    first_reply, source, reply = piece["reply"](OLD_A), piece["turn"](NEW_Q), piece["reply"](NEW_A)
    length = len(first_source) + len(first_reply) + 20  # the first turn whole, 20 tokens for the second
    kept_source, kept_reply = infer_seqlen(len(source), len(reply), 20)
    [sample], _ = tokenize_records(tok, [sft_record()], length, truncation="keep_start")
    assert sample.input_ids == first_source + first_reply + source[:kept_source] + reply[:kept_reply]
    assert len(sample.input_ids) == length
    # a length inside the first turn: LLaMA-Factory leaves the second turn out
    s, t = infer_seqlen(len(first_source), len(first_reply), 40)
    [inside], _ = tokenize_records(tok, [sft_record()], 40, truncation="keep_start")
    assert inside.input_ids == first_source[:s] + first_reply[:t]


def test_sft_keep_prompt_cuts_the_end_and_drop_leaves_the_record_out(tok, piece):
    whole = (piece["head"] + piece["turn"](OLD_Q) + piece["reply"](OLD_A) + piece["turn"](NEW_Q)
             + piece["reply"](NEW_A))
    length = len(piece["head"] + piece["turn"](OLD_Q)) + 5  # into the first reply
    [sample], _ = tokenize_records(tok, [sft_record()], length, truncation="keep_prompt")
    assert sample.input_ids == whole[:length]
    assert tokenize_records(tok, [sft_record()], length - 5, truncation="keep_prompt")[0] == []  # no target left
    samples, report = tokenize_records(tok, [sft_record()], length, truncation="drop")
    assert samples == [] and (report.read, report.truncated, report.dropped) == (1, 0, 1)
    [kept], report = tokenize_records(tok, [sft_record()], len(whole), truncation="drop")
    assert kept.input_ids == whole and report.truncated == 0


def long_pair():
    return PairRecord("p.jsonl:1", [("system", SYSTEM), ("user", OLD_Q), ("assistant", OLD_A), ("user", NEW_Q)],
                      "故宫在北京。", NEW_A)


def test_a_pairs_two_replies_are_cut_alike_under_each_mode(tok, piece):
    head, older, latest = piece["head"], piece["turn"](OLD_Q) + piece["reply"](OLD_A), piece["turn"](NEW_Q)
    chosen, rejected = piece["reply"]("故宫在北京。"), piece["reply"](NEW_A)  # the rejected is the longer
    prompt = head + older + latest
    length = len(prompt) - 10
    [end], report = tokenize_pairs(tok, [long_pair()], length, "keep_end", bar=False)
    turn, reply = infer_seqlen(len(latest), len(rejected), length - len(head))
    rest = length - len(head) - turn - reply
    kept_prompt = head + older[len(older) - rest:] + latest[len(latest) - turn:]
    assert end.chosen.input_ids == kept_prompt + chosen[:reply] and end.rejected.input_ids == kept_prompt + rejected[:reply]
    assert end.chosen.labels == [IGNORE_ID] * len(kept_prompt) + chosen[:reply]  # only the reply is a target
    assert (report.read, report.truncated, report.dropped) == (1, 1, 0)
    [start], _ = tokenize_pairs(tok, [long_pair()], length, "keep_start", bar=False)
    source, target = infer_seqlen(len(prompt), len(rejected), length)  # the prompt as one block
    assert start.chosen.input_ids == prompt[:source] + chosen[:target]
    assert start.rejected.input_ids == prompt[:source] + rejected[:target]
    for mode in ("keep_prompt", "drop"):  # the prompt alone fills the row
        pairs, report = tokenize_pairs(tok, [long_pair()], length, mode, bar=False)
        assert pairs == [] and report.dropped == 1
        assert [w for w, _ in report.no_room] == (["p.jsonl:1"] if mode == "keep_prompt" else [])


def test_a_kto_record_keeps_its_latest_turn_and_masks_the_older_reply(tok, piece):
    record = KtoRecord("k.jsonl:1", [("system", SYSTEM), ("user", OLD_Q), ("assistant", OLD_A), ("user", NEW_Q)],
                       NEW_A, True)
    head, older = piece["head"], piece["turn"](OLD_Q) + piece["reply"](OLD_A)
    latest, reply = piece["turn"](NEW_Q), piece["reply"](NEW_A)
    length = len(head) + len(latest) + len(reply) + 5
    [end], report = tokenize_kto(tok, [record], length, "keep_end", bar=False)
    assert end.sample.input_ids == head + older[-5:] + latest + reply
    assert end.sample.labels == [IGNORE_ID] * (len(head) + 5 + len(latest)) + reply  # KTO scores the reply only
    [start], _ = tokenize_kto(tok, [record], length, "keep_start", bar=False)
    prompt = head + older + latest
    source, target = infer_seqlen(len(prompt), len(reply), length)
    assert start.sample.input_ids == prompt[:source] + reply[:target]
    [cut], _ = tokenize_kto(tok, [record], len(prompt) + 3, "keep_prompt", bar=False)
    assert cut.sample.input_ids == prompt + reply[:3]
    assert tokenize_kto(tok, [record], length, "drop", bar=False)[0] == []


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def test_a_run_prints_each_files_truncated_and_dropped_records(tmp_path, tok, capsys):
    from llama_npu.data.dataset_info import train_inputs
    from llama_npu.data.source import training_source

    short = {"instruction": "你好", "output": "你好！"}
    long = {"instruction": "请详细解释" * 40, "output": "好的。" * 20}
    a = write_jsonl(tmp_path / "a.jsonl", [short, long, short])
    b = write_jsonl(tmp_path / "b.jsonl", [long, long])
    for mode, (a_cut, b_cut) in {"keep_end": ("1 of 3 records truncated, 0 dropped", "2 of 2 records truncated, 0 "
                                              "dropped"),
                                 "drop": ("0 of 3 records truncated, 1 dropped", "0 of 2 records truncated, 2 "
                                          "dropped")}.items():
        recipe = recipe_from_dict(yaml.safe_load(SMOKE.read_text()), [
            f"data.train_files=[{a}, {b}]", "data.eval_files=[]", "data.max_seq_len=32", f"data.truncation={mode}"])
        training_source(recipe, tok)
        out = capsys.readouterr().out
        assert f"[llama-npu] {a}: {a_cut} (data.truncation: {mode}, rows of 33 tokens)\n" in out
        assert f"[llama-npu] {b}: {b_cut} (data.truncation: {mode}, rows of 33 tokens)\n" in out
    from llama_npu.objectives.kto.replies import reply_samples

    replies = write_jsonl(tmp_path / "k.jsonl", [{**long, "label": True}, {**short, "label": False}])
    recipe = recipe_from_dict(yaml.safe_load(SMOKE.read_text()), [
        "train.objective=kto", f"data.train_files=[{replies}]", "data.eval_files=[]", "data.max_seq_len=32"])
    assert len(reply_samples(recipe, tok, train_inputs(recipe))) == 2
    assert (f"[llama-npu] {replies}: 1 of 2 labelled replies truncated, 0 dropped (data.truncation: keep_end, rows "
            f"of 33 tokens)\n") in capsys.readouterr().out


def test_records_of_dataset_info_entries_are_cut_and_named_by_their_entry(tmp_path, tok, capsys):
    from llama_npu.data.dataset_info import train_inputs
    from llama_npu.data.source import training_source

    short = {"instruction": "你好", "output": "你好！"}
    long = {"instruction": "请详细解释" * 40, "output": "好的。" * 20}
    entries = {"mine": {"file_name": "mine.json"}, "pairs": {"file_name": "pairs.json", "ranking": True, "columns": {
        "prompt": "instruction", "chosen": "chosen", "rejected": "rejected"}}}
    (tmp_path / "dataset_info.json").write_text(json.dumps(entries), encoding="utf-8")
    (tmp_path / "mine.json").write_text(json.dumps([short, long, long], ensure_ascii=False), encoding="utf-8")
    pair = {"instruction": "请详细解释" * 40, "chosen": "好的。" * 20, "rejected": "不。"}
    (tmp_path / "pairs.json").write_text(json.dumps([pair, pair], ensure_ascii=False), encoding="utf-8")
    for mode, counts in {"keep_end": "2 of 3 records truncated, 0 dropped",
                         "drop": "0 of 3 records truncated, 2 dropped"}.items():
        recipe = recipe_from_dict(yaml.safe_load(SMOKE.read_text()), [
            "data.train_files=[]", f"data.dataset_dir={tmp_path}", "data.dataset=mine", "data.eval_files=[]",
            "data.max_seq_len=32", f"data.truncation={mode}"])
        assert len(training_source(recipe, tok)) == (3 if mode == "keep_end" else 1)
        assert (f"[llama-npu] mine ({tmp_path / 'mine.json'}): {counts} (data.truncation: {mode}, rows of 33 "
                f"tokens)\n") in capsys.readouterr().out
    from llama_npu.objectives.dpo.source import pair_samples

    recipe = recipe_from_dict(yaml.safe_load(SMOKE.read_text()), [
        "train.objective=dpo", "data.train_files=[]", f"data.dataset_dir={tmp_path}", "data.dataset=pairs",
        "data.eval_files=[]", "data.max_seq_len=32"])
    assert [len(p.chosen.input_ids) for p in pair_samples(recipe, tok, train_inputs(recipe))] == [33, 33]
    assert (f"[llama-npu] pairs ({tmp_path / 'pairs.json'}): 2 of 2 preference pairs truncated, 0 dropped "
            f"(data.truncation: keep_end, rows of 33 tokens)\n") in capsys.readouterr().out


def test_dpo_on_long_pair_reads_as_data_truncation_with_one_line(capsys):
    tree = yaml.safe_load(SMOKE.read_text())
    recipe = recipe_from_dict(tree, ["dpo.on_long_pair=drop", "train.objective=dpo", "data.eval_files=[]"])
    assert recipe.data.truncation == "drop" and recipe.dpo.on_long_pair == ""
    assert capsys.readouterr().err == ("[llama-npu] warning: dpo.on_long_pair: drop is deprecated; it reads as "
                                       "data.truncation: drop, the key for every objective: write that instead\n")
    sft = yaml.safe_load(SMOKE.read_text())
    assert recipe_from_dict(sft, ["dpo.on_long_pair=truncate"]).data.truncation == "keep_prompt"
    assert capsys.readouterr().err == ""  # an SFT recipe (or a stored one) carrying the old DPO default: no line
    with pytest.raises(RecipeError, match="^dpo.on_long_pair: truncate .* beside data.truncation: keep_start; "
                                          "remove dpo.on_long_pair$"):
        recipe_from_dict(tree, ["dpo.on_long_pair=truncate", "data.truncation=keep_start"])


def test_prepared_data_made_under_another_mode_is_refused(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"instruction": "请详细解释" * 40, "output": "好的。"}] * 3)
    out = tmp_path / "prepared"
    proc = run_cli("prepare-data", "--format", "alpaca", "--input", data, "--output", out, "--max-seq-len", "32",
                   "--truncation", "keep_start", check=True)
    assert "truncated 3 (data.truncation: keep_start, rows of 33 tokens)" in proc.stdout
    assert json.loads((out / "meta.json").read_text())["truncation"] == "keep_start"
    common = [SMOKE, "--set", f"data.prepared={out}", "--set", "data.train_files=[]", "--set", "data.eval_files=[]",
              "--set", "data.max_seq_len=32"]
    refused = run_cli("validate", *common)
    assert refused.returncode == 2
    assert (f"data.prepared={out} was prepared under --truncation keep_start, but data.truncation=keep_end; prepare "
            f"it again with --truncation keep_end, or set data.truncation: keep_start") in refused.stderr
    assert run_cli("validate", *common, "--set", "data.truncation=keep_start").returncode == 0


def old_run(tmp_path, on_long_pair="truncate"):
    """A run directory whose recipe.yaml was written before data.truncation existed."""
    tree = recipe_from_dict(yaml.safe_load(SMOKE.read_text()), ["data.max_seq_len=32", "data.eval_files=[]"]).to_dict()
    del tree["data"]["truncation"]
    tree["dpo"]["on_long_pair"] = on_long_pair
    run = tmp_path / f"old-{on_long_pair}"
    run.mkdir(exist_ok=True)
    (run / "recipe.yaml").write_text(yaml.safe_dump(tree, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return run


def test_a_run_older_than_the_key_resumes_as_it_started(tmp_path):
    assert stored_recipe(old_run(tmp_path)).data.truncation == "keep_prompt"
    assert stored_recipe(old_run(tmp_path, "drop")).data.truncation == "drop"
    run = old_run(tmp_path)
    assert yaml.safe_load((run / "recipe.yaml").read_text())["dpo"]["on_long_pair"] == "truncate"  # as written then
    line = "(data.truncation: keep_prompt, rows of 33 tokens)"
    own = run_cli("validate", "--resume", "auto", "--output-dir", run)  # the run's own recipe.yaml
    assert own.returncode == 0, own.stderr
    assert line in own.stdout and "deprecated" not in own.stderr
    # the recipe file names no truncation: the run's mode, said in one line, and no refusal
    again = run_cli("validate", SMOKE, "--set", "data.max_seq_len=32", "--set", "data.eval_files=[]", "--resume",
                    "auto", "--output-dir", run)
    assert again.returncode == 0, again.stderr
    assert line in again.stdout and (f"resume: data.truncation: keep_prompt, as the run started ({run}/recipe.yaml "
                                     f"predates the key; the recipe names none)") in again.stdout
    # a recipe that names another mode is a change the resume check refuses
    changed = run_cli("validate", SMOKE, "--set", "data.max_seq_len=32", "--set", "data.eval_files=[]", "--set",
                      "data.truncation=keep_end", "--resume", "auto", "--output-dir", run)
    assert changed.returncode == 2 and "data.truncation 'keep_prompt' -> 'keep_end'" in changed.stderr
