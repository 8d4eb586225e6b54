"""`llama-npu eval --task ceval|cmmlu|mmlu` on the shipped samples, checked question by
question against `transformers` on the same prompt ids, and the prompts against lm-eval's
task files; the bad layouts it refuses."""
import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch  # the test extra's reference implementation: a missing torch is an error, never a skip
import transformers
import yaml
import lm_eval.tasks
from hypothesis import given, settings, strategies as st

from conftest import REPO, run_cli


SAMPLES = {task: REPO / "data" / f"{task}_sample" for task in ("ceval", "cmmlu", "mmlu")}
LM_EVAL_TASKS = Path(lm_eval.tasks.__file__).parent
CUT_TO = 280  # --max-seq-len of the C-Eval 5-shot run: some of its prompts (247-310 tokens) lose shots

# name -> (checkpoint kind, task, shots, extra arguments): each layout at 0 and 5 shots, each
# kind of checkpoint (converted, a LoRA run trained on chat data, a Hugging Face directory).
RUNS = {
    "converted-ceval-5": ("converted", "ceval", 5, ["--max-seq-len", str(CUT_TO)]),
    "converted-ceval-0-self": ("converted", "ceval", 0, ["--compare", "<converted>"]),
    "hf-mmlu-5": ("hf", "mmlu", 5, []),
    "hf-cmmlu-0": ("hf", "cmmlu", 0, []),
    "lora-cmmlu-5": ("lora", "cmmlu", 5, []),
    # --compare of a base with a chat fine-tune (one format: chat), and a forced second format
    "hf-vs-lora-mmlu-0": ("hf", "mmlu", 0, ["--compare", "<lora>", "--subjects", "astronomy"]),
    "converted-vs-hf-chat-ceval-0": ("converted", "ceval", 0, ["--compare", "<hf>", "--compare-chat",
                                                               "--subjects", "high_school_physics"]),
    # through compiled graphs (the runs above, small enough on the tiny model, run op by op)
    "hf-vs-lora-ceval-0-graphs": ("hf", "ceval", 0, ["--compare", "<lora>", "--execution", "static"]),
}


@pytest.fixture(scope="session")
def exam_runs(hf_dir, conversions, request, tmp_path_factory):
    """name -> (summary from --json, records from --output, the transformers reference model),
    each run once per session when a test first asks for it."""
    out = tmp_path_factory.mktemp("exams")
    results = {}

    def checkpoint_and_reference(kind):
        if kind == "lora":  # the merged export of the LoRA run is its reference
            lora_run, export = request.getfixturevalue("lora_export")
            return lora_run, transformers.LlamaForCausalLM.from_pretrained(export).eval()
        return (conversions["float32"] if kind == "converted" else hf_dir[0]), hf_dir[1]

    def run(name):
        if name not in results:
            kind, task, shots, extra = RUNS[name]
            checkpoint, reference = checkpoint_and_reference(kind)
            given = {"<converted>": lambda: conversions["float32"], "<hf>": lambda: hf_dir[0],
                     "<lora>": lambda: request.getfixturevalue("lora_export")[0]}
            extra = [str(given[a]()) if a in given else a for a in extra]
            proc = run_cli("eval", "--task", task, "--checkpoint", checkpoint, "--data", SAMPLES[task], "--shots",
                           shots, "--batch-size", 8, "--output", out / f"{name}.jsonl", "--json", *extra, check=True)
            lines = (out / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
            results[name] = json.loads(proc.stdout), [json.loads(line) for line in lines], reference
        return results[name]
    return run


def reference_logprobs(model, record) -> np.ndarray:
    """log p(choice | prompt_ids) for each choice, summed over its tokens, by transformers.
    The choices differ only in their last token here, so one forward pass scores all four."""
    choices = [c if isinstance(c, list) else [c] for c in record["choice_ids"]]
    shared = choices[0][:-1]
    assert all(c[:-1] == shared for c in choices)
    with torch.no_grad():
        logits = model(torch.tensor([record["prompt_ids"] + shared])).logits[0, -len(shared) - 1:]
    logp = torch.log_softmax(logits.double(), -1)
    prefix = sum(logp[i, t].item() for i, t in enumerate(shared))
    return np.array([prefix + logp[-1, c[-1]].item() for c in choices])


def test_a_second_run_loads_its_graphs_from_the_compile_cache(hf_dir, tmp_path):
    """eval --task compiles its graphs into MindSpore's compile cache in a directory of ours;
    the next run of the same shapes, in a new process, loads them (the files are not written
    again) and scores exactly as the first."""
    cache = tmp_path / "compile"
    args = ["eval", "--task", "ceval", "--checkpoint", hf_dir[0], "--data", SAMPLES["ceval"], "--shots", 0,
            "--batch-size", 1, "--device", "cpu", "--json", "--execution", "static"]
    run_cli(*args, "--output", tmp_path / "first.jsonl", env={"LLAMA_NPU_COMPILE_CACHE": str(cache)}, check=True)
    graphs = {p: p.stat().st_mtime_ns for p in cache.rglob("*.mindir")}
    assert len(graphs) == 2 and len({p.parent for p in graphs}) == 1  # backbone and head, one directory
    run_cli(*args, "--output", tmp_path / "second.jsonl", env={"LLAMA_NPU_COMPILE_CACHE": str(cache)}, check=True)
    assert {p: p.stat().st_mtime_ns for p in cache.rglob("*.mindir")} == graphs
    assert (tmp_path / "second.jsonl").read_text() == (tmp_path / "first.jsonl").read_text()
    assert not list(REPO.glob("rank_0")) and not list(REPO.glob("kernel_meta"))


@pytest.mark.parametrize("name", sorted(RUNS))
def test_every_choice_scores_as_transformers_does(exam_runs, name):
    """The four log-likelihoods of every question equal transformers' on the same prompt ids
    within 1e-3, the predictions are identical, and the summary's accuracy is the share of
    predictions equal to the answers, per subject and overall."""
    summary, records, reference = exam_runs(name)
    kind, task, shots, _ = RUNS[name]
    letters = ["A", "B", "C", "D"]
    for record in records:
        theirs = reference_logprobs(reference, record)
        ours = np.array([record["logprobs"][letter] for letter in letters])
        assert np.abs(ours - theirs).max() < 1e-3, (record["subject"], record["id"])
        assert record["prediction"] == letters[int(np.argmax(theirs))]
        if not summary["chat"]:  # one token a choice (chat prompts: below)
            assert all(isinstance(c, int) for c in record["choice_ids"])
    assert summary["overall"]["n"] == len(records)
    right = [r["prediction"] == r["answer"] for r in records]
    assert summary["overall"]["acc"] == pytest.approx(np.mean(right))
    for subject, row in summary["subjects"].items():
        mine = [r["prediction"] == r["answer"] for r in records if r["subject"] == subject]
        assert row["n"] == len(mine) and row["acc"] == pytest.approx(np.mean(mine))
    # on by default for a run trained on chat data only, and for both sides of a --compare with one
    assert summary["chat"] is (kind == "lora" or "<lora>" in RUNS[name][3])
    assert {r["shots"] for r in records} <= set(range(shots + 1))


def test_prompts_are_lm_evals_from_its_task_files(exam_runs):
    """The C-Eval 5-shot prompt, decoded, is lm-eval's ceval-valid template filled in (its
    description, the first dev rows as shots, ' X' answers, '\\n\\n' between them); a prompt
    over --max-seq-len dropped shots from the end until it fit, and the output counts them."""
    from llama_npu.data.tokenizer import load_tokenizer

    summary, records, _ = exam_runs("converted-ceval-5")
    tok = load_tokenizer("llama3.2")
    template = yaml.safe_load((LM_EVAL_TASKS / "ceval" / "_default_ceval_yaml").read_text(encoding="utf-8"))
    assert template["doc_to_text"].endswith("答案：") and template["fewshot_config"]["sampler"] == "first_n"

    def rows(path):
        return list(csv.DictReader(path.open(encoding="utf-8")))

    def question(row):
        return f"{row['question'].strip()}\nA. {row['A']}\nB. {row['B']}\nC. {row['C']}\nD. {row['D']}\n答案："

    for record in records:
        subject = record["subject"]
        description = yaml.safe_load((LM_EVAL_TASKS / "ceval" / f"ceval-valid_{subject}.yaml").read_text(
            encoding="utf-8"))["description"]
        dev = rows(SAMPLES["ceval"] / "dev" / f"{subject}_dev.csv")[:record["shots"]]
        row = rows(SAMPLES["ceval"] / "val" / f"{subject}_val.csv")[int(record["id"])]
        expected = description + "".join(question(d) + f" {d['answer']}\n\n" for d in dev) + question(row)
        assert record["prompt_ids"][0] == 128000 and tok.decode(record["prompt_ids"][1:]) == expected
        assert len(record["prompt_ids"]) + 1 <= CUT_TO
        assert [tok.decode([c]) for c in record["choice_ids"]] == [" A", " B", " C", " D"]
    fewer = [r for r in records if r["shots"] < 5]
    assert 0 < len(fewer) < len(records) and summary["fewer_shots"] == len(fewer) and summary["truncated"] == 0


def test_chat_fine_tunes_get_the_prompt_in_the_training_chat_format(exam_runs):
    """A run trained on chat data: lm-eval's prompt inside the Llama 3 chat format (the
    description as the system turn, each shot a user/assistant turn) and the choice letter
    right after the assistant header, as data/chat_template.py renders it for training. As
    lm-eval does, the context's trailing whitespace (the header's "\n\n") is scored as the
    start of each continuation."""
    from llama_npu.data.tokenizer import load_tokenizer

    summary, records, _ = exam_runs("lora-cmmlu-5")
    tok = load_tokenizer("llama3.2")
    assert "trained on alpaca data" in summary["chat_reason"]
    for record in records:
        text = tok.decode(record["prompt_ids"], skip_special_tokens=False)
        assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n以下是关于")
        assert text.endswith("答案：<|eot_id|><|start_header_id|>assistant<|end_header_id|>")
        assert text.count("<|start_header_id|>assistant<|end_header_id|>") == record["shots"] + 1 == 6
        assert [tok.decode(c) for c in record["choice_ids"]] == ["\n\nA", "\n\nB", "\n\nC", "\n\nD"]


def test_compare_with_itself_gives_zero_deltas(exam_runs):
    summary, records, _ = exam_runs("converted-ceval-0-self")
    assert summary["compare"]["overall"] == summary["overall"]
    assert all(v == 0 for row in summary["delta"]["subjects"].values() for v in row.values())
    assert all(v == 0 for row in summary["delta"]["categories"].values() for v in row.values())
    assert summary["delta"]["overall"] == {"acc": 0, "acc_norm": 0}
    assert set(summary["categories"]) == {"STEM", "Social Science", "Humanities", "Other", "Hard"}
    assert summary["categories"]["Hard"]["n"] == 3  # high_school_physics is in C-Eval's hard subset
    for record in records:
        assert record["compare"] == {k: record[k] for k in ("prompt_ids", "choice_ids", "logprobs", "prediction",
                                                            "acc", "acc_norm", "shots")}


def test_the_table_shows_each_subject_category_and_overall(exam_runs):
    """What eval --task prints without --json (format_summary of the same summary)."""
    from llama_npu.evaluation.exams.report import format_summary

    summary = exam_runs("converted-ceval-5")[0]
    lines = format_summary(summary).splitlines()
    assert lines[0] == "C-Eval val, 5-shot, 12 questions"
    assert f"plain prompt (not a run directory); {summary['fewer_shots']} questions with fewer shots" in lines[1]
    rows = {line.split()[0]: line.split()[-3:] for line in lines[3:] if line[:1].isalnum()}
    assert list(rows) == ["basic_medicine", "high_school_geography", "high_school_physics", "modern_chinese_history",
                          "STEM", "Social", "Humanities", "Other", "Hard", "overall"]
    assert rows["overall"] == ["12", f"{summary['overall']['acc']:.4f}", f"{summary['overall']['acc_norm']:.4f}"]
    compared = format_summary(exam_runs("converted-ceval-0-self")[0]).splitlines()
    assert compared[1].startswith("A ") and compared[2].startswith("B ") and "Δacc" in compared[4]
    assert compared[-1].split()[-4:-3] == ["+0.0000"] and compared[-1].split()[-1] == "+0.0000"


def recompute_from_output(records, side, model) -> float:
    """The accuracy of one side of an --output file, recomputed from its prompt and choice ids
    alone with transformers, after checking every record's log-likelihoods and predictions."""
    right = []
    for record in records:
        scored = record if side == "A" else record["compare"]
        theirs = reference_logprobs(model, scored)
        assert np.abs(np.array([scored["logprobs"][x] for x in "ABCD"]) - theirs).max() < 1e-3
        assert scored["prediction"] == "ABCD"[int(np.argmax(theirs))]
        right.append("ABCD"[int(np.argmax(theirs))] == record["answer"])
        assert scored["acc"] == float(right[-1])
    return float(np.mean(right))


def test_compare_scores_a_base_and_a_chat_fine_tune_in_one_format(exam_runs, lora_export):
    """A Hugging Face base against a LoRA run trained on chat data: both in the chat format
    (the same prompt ids), the summary saying so and why; every score of both sides
    recomputes from the --output file (prompt ids, choice ids) with transformers."""
    from llama_npu.data.tokenizer import load_tokenizer
    from llama_npu.evaluation.exams.report import format_summary

    summary, records, base = exam_runs("hf-vs-lora-mmlu-0")
    assert summary["chat"] is True and summary["compare"]["chat"] is True
    assert summary["chat_reason"] == f"B {lora_export[0]} is a run trained on alpaca data"
    assert summary["delta"]["changed"] == ["checkpoint"]
    assert format_summary(summary).splitlines()[3] == ("one prompt format for both, the Llama 3 chat format: "
                                                       "Δ = B - A compares the checkpoints only")
    tok = load_tokenizer("llama3.2")
    for record in records:
        assert record["compare"]["prompt_ids"] == record["prompt_ids"]
        assert record["question"].endswith("Answer:") and record["question"] in tok.decode(record["prompt_ids"])
    fine_tune = transformers.LlamaForCausalLM.from_pretrained(lora_export[1]).eval()
    assert recompute_from_output(records, "A", base) == pytest.approx(summary["overall"]["acc"])
    assert recompute_from_output(records, "B", fine_tune) == pytest.approx(summary["compare"]["overall"]["acc"])


def test_compare_scores_the_second_checkpoint_through_the_first_ones_graphs(exam_runs, lora_export):
    """--compare loads B's weights into A's network: the two graphs (the backbone and the
    head) compile once for A and none for B, and B's scores are still the fine-tune's own
    (transformers on the same prompt ids). Left to choose (--execution auto), a small exam on
    the CPU (the other runs) compiles nothing at all."""
    summary, records, base = exam_runs("hf-vs-lora-ceval-0-graphs")
    assert (summary["graphs_compiled"], summary["compare"]["graphs_compiled"]) == (2, 0)
    assert summary["compile_seconds"] > 0 and summary["compare"]["compile_seconds"] == 0
    fine_tune = transformers.LlamaForCausalLM.from_pretrained(lora_export[1]).eval()
    assert recompute_from_output(records, "A", base) == pytest.approx(summary["overall"]["acc"])
    assert recompute_from_output(records, "B", fine_tune) == pytest.approx(summary["compare"]["overall"]["acc"])
    assert any(r["compare"]["logprobs"] != r["logprobs"] for r in records)
    small = exam_runs("hf-vs-lora-mmlu-0")[0]
    assert (small["graphs_compiled"], small["compare"]["graphs_compiled"]) == (0, 0)


def test_a_forced_second_format_is_said_to_change_two_things(exam_runs):
    """--compare-chat scores B (the same weights as A here) in the chat format, A in the plain
    prompt: the summary and the delta say that the checkpoint and the prompt format both
    changed; B's scores still recompute from the file."""
    from llama_npu.evaluation.exams.report import format_summary

    summary, records, model = exam_runs("converted-vs-hf-chat-ceval-0")
    assert (summary["chat"], summary["compare"]["chat"]) == (False, True)
    assert summary["compare"]["chat_reason"] == "--compare-chat"
    assert summary["delta"]["changed"] == ["checkpoint", "prompt format"]
    lines = format_summary(summary).splitlines()
    assert lines[3].startswith("Δ = B - A changes two things: the checkpoint and the prompt format (A plain prompt, "
                               "B Llama 3 chat format)")
    assert lines[-1].split() == ["Δ:", "checkpoint", "and", "prompt", "format", "changed", "together"]
    assert all(r["compare"]["prompt_ids"] != r["prompt_ids"] for r in records)
    assert recompute_from_output(records, "B", model) == pytest.approx(summary["compare"]["overall"]["acc"])


# ---------------------------------------------------------------- bad input

def broken_copy(tmp_path, task, path, edit):
    data = tmp_path / task
    shutil.copytree(SAMPLES[task], data)
    target = data / path
    if edit is None:
        target.unlink()
    else:
        lines = target.read_text(encoding="utf-8").splitlines()
        edit(lines)
        target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return data


def _replace(lines, index, old, new):
    lines[index] = lines[index].replace(old, new)


BAD = {
    "not a layout": ("ceval", lambda tmp: tmp, [], "--data {data}: no val/<subject>_val.csv files; expected "
                                                   "C-Eval's layout"),
    "unknown subject": ("mmlu", lambda tmp: SAMPLES["mmlu"], ["--subjects", "astrology"],
                        "--subjects astrology: no {data}/test/astrology_test.csv; the test split here has astronomy, "
                        "high_school_geography"),
    "missing choice": ("cmmlu", lambda tmp: broken_copy(tmp, "cmmlu", "test/computer_science.csv",
                                                       lambda ls: _replace(ls, 2, ",25,", ",,")), [],
                       "{data}/test/computer_science.csv:3: choice B is empty"),
    "answer letter": ("ceval", lambda tmp: broken_copy(tmp, "ceval", "val/basic_medicine_val.csv",
                                                       lambda ls: ls.__setitem__(1, ls[1].rsplit(",", 2)[0] + ",E,")), [],
                      "{data}/val/basic_medicine_val.csv:2: answer 'E' is not one of A, B, C, D"),
    # a .jsonl or .csv file is read as your own exam: instruction records are not questions
    "jsonl file": ("ceval", lambda tmp: REPO / "data" / "zh_instruct_eval.jsonl", [],
                   "{data}:1: no question, A, B, C, D, answer column; your own exam has the columns question, A, B, "
                   "C, D, answer (and subject); a benchmark is a directory in C-Eval's layout"),
    "no dev split": ("mmlu", lambda tmp: broken_copy(tmp, "mmlu", "dev/astronomy_dev.csv", None), [],
                     "{data}/dev/astronomy_dev.csv: missing; --shots 5 takes its examples from the dev split"),
    "columns": ("cmmlu", lambda tmp: broken_copy(tmp, "cmmlu", "dev/computer_science.csv",
                                                 lambda ls: ls.__setitem__(0, "Question,A,B,C,D")), [],
                "{data}/dev/computer_science.csv:1: header is 'Question,A,B,C,D'; CMMLU files start with "
                "',Question,A,B,C,D,Answer'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_data_is_one_line_naming_the_file_and_line_and_writes_nothing(tmp_path, case):
    task, make, extra, message = BAD[case]
    data = make(tmp_path / "data")
    if case == "not a layout":
        data.mkdir(parents=True)
        (data / "notes.txt").write_text("not a benchmark")
    out = tmp_path / "scores.jsonl"
    proc = run_cli("eval", "--task", task, "--checkpoint", REPO / "no-such-checkpoint", "--data", data,
                   "--output", out, *extra)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llama-npu: error: "), proc.stderr
    assert message.format(data=data) in lines[0], lines[0]
    assert not out.exists() and proc.stdout == ""


# ---------------------------------------------------------------- the adapter's other two requests

def test_rolling_loglikelihood_and_generate_until_match_transformers(ms, hf_dir, conversions):
    """loglikelihood_rolling (perplexity tasks) over disjoint --max-seq-len windows, and
    generate_until (generative tasks) greedy and cut at its `until` string, as transformers
    computes them on the same model. The windows score the same op by op, through the two
    dynamic-shape graphs (the CPU's) and through a graph a padded width (Ascend's)."""
    from lm_eval import utils
    from lm_eval.api.instance import Instance

    from llama_npu.data.tokenizer import load_tokenizer
    from llama_npu.evaluation.exams.lm_adapter import MindSporeLM
    from llama_npu.evaluation.loaded_model import build_from_checkpoint

    reference = hf_dir[1]
    net, _, _ = build_from_checkpoint(conversions["float32"], 16)
    tok = load_tokenizer("llama3.2")
    lm = MindSporeLM(net, tok, max_seq_len=16, batch_size=2, progress=False)
    text = "长江是中国最长的河流，黄河是中国第二长的河流，它们都向东流入大海。"
    tokens = tok.encode(text, add_special_tokens=False).ids
    windows = list(map(utils.make_disjoint_window, utils.get_rolling_token_windows(
        token_list=tokens, prefix_token=128000, max_seq_len=16, context_len=1)))
    assert len(windows) > 1 and sum(len(c) for _, c in windows) == len(tokens)
    expected = 0.0
    with torch.no_grad():
        for context, continuation in windows:
            logits = reference(torch.tensor([context + continuation[:-1]])).logits[0, -len(continuation):]
            expected += torch.log_softmax(logits.double(), -1)[torch.arange(len(continuation)), continuation].sum().item()
    [ours] = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    assert ours == pytest.approx(expected, abs=1e-3) and lm.compiled == set()
    for execution, graphs in (("dynamic", {("backbone", None), ("head", None)}),
                              ("static", {("backbone", 16), ("head", 32)})):
        compiled = MindSporeLM(net, tok, max_seq_len=16, batch_size=2, progress=False, execution=execution)
        [ours] = compiled.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
        assert ours == pytest.approx(expected, abs=1e-3) and compiled.compiled == graphs

    prompt = "长江流入"
    [reply] = lm.generate_until([Instance("generate_until", {}, (prompt, {"until": ["\n"], "max_gen_toks": 6}), 0)])
    ids = [128000] + tok.encode(prompt, add_special_tokens=False).ids
    assert len(ids) + 6 <= 16  # not cut
    with torch.no_grad():
        out = reference.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False, eos_token_id=[128001, 128008,
                                 128009], pad_token_id=128004)[0, len(ids):].tolist()
    assert reply == tok.decode([t for t in out if t not in (128001, 128008, 128009)]).split("\n")[0]


def test_the_compile_cache_removes_entries_of_other_versions_unused_for_an_hour(tmp_path, monkeypatch):
    """A graph file holds the weights (GBs for a 3B) and an upgrade makes every entry
    unreachable: enabling the cache removes another version's entries once unused for an hour,
    and keeps this version's, another version's in recent use, and its own."""
    import json
    import os
    import sys
    import time

    from llama_npu.evaluation import compile_cache

    monkeypatch.setenv(compile_cache.ROOT_ENV, str(tmp_path))
    monkeypatch.setattr(sys, "argv", [__file__])  # MindSpore hashes the entry script: an xdist worker has none
    for name in ("MS_COMPILER_CACHE_PATH", "MS_COMPILER_CACHE_ENABLE"):  # set, so that teardown restores them
        monkeypatch.setenv(name, "")
    versions = compile_cache._versions()
    hour_ago = time.time() - 2 * compile_cache.STALE_AFTER

    def entry(name, made_by, age):
        path = tmp_path / name
        path.mkdir()
        (path / "compile_cache_0.mindir").write_bytes(b"graph")
        if made_by is not None:
            (path / compile_cache.MADE_BY).write_text(json.dumps(made_by))
        for p in (path, *path.iterdir()):
            os.utime(p, (age, age))

    entry("old-version", {**versions, "sources": "an older llama-npu"}, hour_ago)
    entry("before-made-by", None, hour_ago)
    entry("other-version-in-use", {**versions, "mindspore": "2.8.0"}, time.time())
    entry("same-version-other-shape", versions, hour_ago)
    own = compile_cache.enable({"shape": "tiny", "batch": 8})
    assert own is not None and json.loads((own / compile_cache.MADE_BY).read_text()) == versions
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [own.name, "other-version-in-use", "same-version-other-shape"])


# ---------------------------------------------------------------- rows packed under a shared prefix

@st.composite
def rows_sharing_prefixes(draw):
    """Distinct rows over a small vocabulary, built from a few prefixes (as a subject's shots)
    and suffixes: some rows are prefixes of others, some share nothing."""
    prefixes = draw(st.lists(st.lists(st.integers(0, 3), max_size=12), min_size=1, max_size=4))
    rows = {tuple(draw(st.sampled_from(prefixes)) + draw(st.lists(st.integers(0, 3), max_size=10)))
            for _ in range(draw(st.integers(1, 24)))}
    return sorted(r for r in rows if r)


@settings(max_examples=300, deadline=None)
@given(rows_sharing_prefixes(), st.integers(1, 4))
def test_a_pack_holds_every_row_at_its_own_positions_seeing_only_itself(rows, batch_size):
    """Every row of every pack reads back whole from the pack: its tokens, at its own
    positions, each seeing exactly the row's earlier tokens (shared_prefix.segment_mask);
    no pack is wider than the chosen cap, and every row is in exactly one pack."""
    from llama_npu.evaluation.exams.shared_prefix import choose_cap, segment_mask

    cap, packs = choose_cap(rows, batch_size, 64, token_cost=10.0, pair_cost=1.0)
    assert sorted(row for pack in packs for row in pack.starts) == rows
    for pack in packs:
        assert len(pack) <= cap and len(pack.ids) == len(pack.positions) == len(pack.segments)
        allowed = segment_mask([pack.segments])[0]
        for row in pack.starts:
            where = [pack.index(row, p) for p in range(len(row))]
            assert [pack.ids[i] for i in where] == list(row) and [pack.positions[i] for i in where] == list(range(len(row)))
            for p, i in enumerate(where):
                assert set(np.flatnonzero(allowed[i])) == set(where[:p + 1]), (row, p)


def test_packs_share_the_shots_and_weigh_attention_against_tokens():
    """Twelve five-shot questions of one subject (a 200-token prefix, 50 of their own): one
    pack of 800 tokens where the rows alone are 3,000. Rows that share nothing stay apart: a
    pack of them would compute no fewer tokens and more pairs of them."""
    from llama_npu.evaluation.exams.shared_prefix import choose_cap

    shots = tuple(range(1000, 1200))
    rows = [shots + tuple(range(q * 100, q * 100 + 50)) for q in range(12)]
    cap, packs = choose_cap(rows, 8, 2048, token_cost=3.8e6, pair_cost=2048)
    assert (cap, [len(p) for p in packs]) == (1024, [800])
    apart = [(q,) + row[1:] for q, row in enumerate(rows)]
    cap, packs = choose_cap(apart, 8, 2048, token_cost=3.8e6, pair_cost=2048)
    assert (cap, [len(p) for p in packs]) == (256, [250] * 12)


@pytest.mark.parametrize("mode", ["op by op", "dynamic-shape graph"])
def test_packed_rows_have_the_hidden_states_they_have_alone(ms, conversions, mode):
    """The scorer's backbone over packs equals LlamaModel over each row alone, at every
    position of every row (1e-5): the in-graph mask and the rotary positions are right."""
    import mindspore
    from llama_npu.evaluation.exams.lm_adapter import shared_prefix_backbone
    from llama_npu.evaluation.exams.shared_prefix import PAD_SEGMENT, choose_cap
    from llama_npu.evaluation.loaded_model import build_from_checkpoint

    net, _, _ = build_from_checkpoint(conversions["float32"], 64)
    net.model.set_train(False)
    rng = np.random.default_rng(0)
    shots = list(rng.integers(0, 5000, 20))
    rows = [tuple([128000] + shots + list(rng.integers(0, 5000, n))) for n in (3, 7, 1, 12)]
    rows += [tuple([128000] + list(rng.integers(0, 5000, 9))), rows[0][:10]]
    cap, packs = choose_cap(rows, 2, 64, token_cost=1e6, pair_cost=1.0)
    assert len(packs) < len(rows)
    width = max(len(p) for p in packs) + 3  # padding after the longest pack too
    arrays = [np.full((len(packs), width), fill, np.int32) for fill in (0, 0, PAD_SEGMENT)]
    for b, pack in enumerate(packs):
        for array, values in zip(arrays, (pack.ids, pack.positions, pack.segments)):
            array[b, :len(pack)] = values
    cell = shared_prefix_backbone(net.model, False)
    inputs = [mindspore.Tensor(a) for a in arrays]
    if mode == "op by op":
        mindspore.set_context(mode=mindspore.PYNATIVE_MODE)
    else:
        cell.set_inputs(*[mindspore.Tensor(shape=[len(packs), None], dtype=mindspore.int32) for _ in range(3)])
    try:
        hidden = cell(*inputs).asnumpy()
    finally:
        mindspore.set_context(mode=mindspore.GRAPH_MODE)
    for b, pack in enumerate(packs):
        for row in pack.starts:
            alone = net.model(mindspore.Tensor([list(row)], mindspore.int32)).asnumpy()[0]
            mine = hidden[b, [pack.index(row, p) for p in range(len(row))]]
            assert np.abs(mine - alone).max() < 1e-5, (row, np.abs(mine - alone).max())


def test_graphs_of_several_widths_score_as_op_by_op(ms, conversions):
    """Requests of many lengths through static graphs: a first call compiles a width for its
    short requests, a second with longer ones adds a wider graph, and the first shape still
    runs (every static shape of one cell, none pinned by set_inputs); both score as op by op
    and as the dynamic-shape graph do."""
    from llama_npu.data.tokenizer import load_tokenizer
    from llama_npu.evaluation.exams.lm_adapter import MindSporeLM
    from llama_npu.evaluation.loaded_model import build_from_checkpoint

    net, _, _ = build_from_checkpoint(conversions["float32"], 256)
    tok = load_tokenizer("llama3.2")
    rng = np.random.default_rng(1)
    shots = [128000] + list(rng.integers(0, 5000, 40))
    requests = [(None, shots[:n] + list(rng.integers(0, 5000, k)), list(rng.integers(0, 5000, c)))
                for n, k, c in zip(rng.integers(1, 41, 30), rng.integers(1, 200, 30), rng.integers(1, 4, 30))]
    short = [r for r in requests if len(r[1]) < 100]
    assert 3 <= len(short) < len(requests)
    scores = {}
    for execution in ("eager", "static", "dynamic"):
        lm = MindSporeLM(net, tok, max_seq_len=256, batch_size=3, progress=False, execution=execution)
        scores[execution] = lm._loglikelihood_tokens(short) + lm._loglikelihood_tokens(requests)
        if execution == "static":
            assert len(lm.widths) > 1, lm.compiled
    for execution in ("static", "dynamic"):
        assert np.abs(np.array(scores[execution])[:, 0] - np.array(scores["eager"])[:, 0]).max() < 1e-4
        assert [g for _, g in scores[execution]] == [g for _, g in scores["eager"]]


def test_your_own_exam_is_scored_as_the_tasks_subjects_are_and_printed_beside_them(hf_dir, tmp_path):
    """C-Eval's basic_medicine questions as a user's own CSV (subject named as C-Eval names it) and
    JSONL (its subject the file's name): the same prompts, so the same log-likelihoods, as the
    benchmark's own subject; each a row beside C-Eval's subjects, outside its categories and overall."""
    from llama_npu.evaluation.exams.report import format_summary

    with open(SAMPLES["ceval"] / "val" / "basic_medicine_val.csv", encoding="utf-8", newline="") as fh:
        rows = [{k: v for k, v in row.items() if k in ("question", "A", "B", "C", "D", "answer")}
                for row in csv.DictReader(fh)]
    own_csv = tmp_path / "my_exam.csv"
    with open(own_csv, "w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, ["subject", "Question", "A", "B", "C", "D", "Answer"])
        writer.writeheader()
        writer.writerows({"subject": "基础医学", "Question": r["question"], **{k: r[k] for k in "ABCD"},
                          "Answer": r["answer"]} for r in rows)
    own_jsonl = tmp_path / "基础医学.jsonl"
    own_jsonl.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "scores.jsonl"
    proc = run_cli("eval", "--task", "ceval", "--checkpoint", hf_dir[0], "--data", SAMPLES["ceval"], own_csv,
                   own_jsonl, "--shots", 0, "--json", "--output", out, check=True)
    summary = json.loads(proc.stdout)
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    by_subject = {}
    for record in records:
        by_subject.setdefault(record["subject"], []).append(record)
    benchmark = by_subject["basic_medicine"]
    for own in ("基础医学 (my_exam.csv)", "基础医学 (基础医学.jsonl)"):
        assert [r["prompt_ids"] for r in by_subject[own]] == [r["prompt_ids"] for r in benchmark]
        assert [r["logprobs"] for r in by_subject[own]] == pytest.approx([r["logprobs"] for r in benchmark], abs=1e-5)
        assert summary["own"][own] == summary["subjects"]["basic_medicine"]
    assert summary["overall"]["n"] == sum(len(rs) for s, rs in by_subject.items() if s in summary["subjects"])
    lines = format_summary(summary).splitlines()
    assert "beside its subjects, your own exams" in lines[0]
    assert any(line.startswith("基础医学 (my_exam.csv)") for line in lines)
