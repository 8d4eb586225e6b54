"""`llama-npu eval --task ceval|cmmlu|mmlu`: score a checkpoint on a benchmark's questions
with lm-eval's task definitions and metrics, through our MindSpore model.

lm-eval's evaluator is not used as a whole for one reason: it builds every prompt with the
task's full few-shot count and leaves an over-long prompt to the model, which cuts it from
the left (losing the task's description first). Here each question's prompt is built by the
task itself (`fewshot_context`), with one shot fewer until it fits --max-seq-len; only a
prompt too long even at zero shots is cut. Requests (`construct_requests`), metrics
(`process_results`, acc and acc_norm) and their mean are lm-eval's.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional

from ...common.atomic import check_writable, replace_file
from ...data.readers import RecordError
from ...data.tokenizer import load_tokenizer
from ..loaded_model import build_from_checkpoint, checkpoint_tokenizer, reload_weights
from .categories import CATEGORY_ORDER, categories_of
from .layouts import LETTERS, ExamData, read_exam
from .own_exam import read_own_exams
from .prompt_format import prompt_formats
from .tasks import build_tasks


@dataclass
class Scored:
    subject: str
    id: str
    question: str  # the question as lm-eval's task renders it (doc_to_text), choices included
    prompt_ids: List[int]
    choice_ids: list  # the continuation's token id per choice (a list where it is several tokens)
    logprobs: Dict[str, float]
    prediction: str
    answer: str
    acc: float
    acc_norm: float
    shots: int
    compare: Optional[dict] = None  # --compare: the second checkpoint's COMPARED fields


# What --output keeps of the second checkpoint's record, so that its scores recompute as the first's do.
COMPARED = ("prompt_ids", "choice_ids", "logprobs", "prediction", "acc", "acc_norm", "shots")


def fit_context(lm, task, doc, shots: int, chat: bool) -> tuple[str, int, bool]:
    """(prompt, shots kept, cut): the task's prompt with the most shots <= `shots` whose
    longest request fits lm.max_length."""
    longest_choice = max(len(lm.tok_encode(c, add_special_tokens=False)) for c in task.doc_to_choice(doc))
    for kept in range(shots, -1, -1):
        context = task.fewshot_context(doc, kept, apply_chat_template=chat, fewshot_as_multiturn=chat,
                                       chat_template=lm.apply_chat_template if chat else None)
        if len(lm.tok_encode(context)) + longest_choice <= lm.max_length:
            return context, kept, False
    return context, 0, True


def score(lm, tasks: dict, data: ExamData, shots: int, chat: bool) -> tuple[List[Scored], dict]:
    """Every question scored by `lm`; (records, counts of questions with fewer shots / cut)."""
    plans, requests = [], []
    fewer = cut = 0
    for subject, task in tasks.items():
        for index, (question, doc) in enumerate(zip(data.questions[subject], task.eval_docs)):
            asked = shots if subject not in data.own else 0  # an own exam has no dev examples
            context, kept, was_cut = fit_context(lm, task, doc, asked, chat)
            fewer += kept < asked
            cut += was_cut
            instances = task.construct_requests(doc=doc, ctx=context, metadata=(subject, index, 1),
                                                apply_chat_template=chat)
            plans.append((subject, task, question, doc, kept, len(requests), len(instances)))
            requests += instances
    results = lm.loglikelihood(requests)
    records = []
    for subject, task, question, doc, kept, first, count in plans:
        mine = results[first:first + count]
        metrics = task.process_results(doc, mine)
        encoded = [lm.encoded[r.args] for r in requests[first:first + count]]
        logprobs = {letter: ll for letter, (ll, _) in zip(LETTERS, mine)}
        records.append(Scored(subject, question.qid, task.doc_to_text(doc), encoded[0][0],
                              [ids[0] if len(ids) == 1 else ids for _, ids in encoded], logprobs,
                              max(logprobs, key=logprobs.get), question.answer, float(metrics["acc"]),
                              float(metrics["acc_norm"]), kept))
    return records, {"fewer_shots": fewer, "truncated": cut}


def summarize(task: str, records: List[Scored], configs: dict, own: List[str] = ()) -> dict:
    """acc / acc_norm and counts per subject, per category and overall (lm-eval's group mean,
    weighted by size: the mean over the questions). The user's `own` subjects are rows of
    their own, in no category and not in the benchmark's overall (unless there is no benchmark)."""
    def mean(rows):
        return {"n": len(rows), "acc": sum(r.acc for r in rows) / len(rows),
                "acc_norm": sum(r.acc_norm for r in rows) / len(rows)}

    by_subject: Dict[str, list] = {}
    for r in records:
        by_subject.setdefault(r.subject, []).append(r)
    by_category: Dict[str, list] = {name: [] for name in CATEGORY_ORDER[task]}
    for subject, rows in by_subject.items():
        for name in categories_of(task, subject, configs[subject]) if subject not in own else []:
            by_category[name] += rows
    benchmark = [r for r in records if r.subject not in own] or records
    return {"subjects": {s: mean(rows) for s, rows in sorted(by_subject.items()) if s not in own},
            "own": {s: mean(by_subject[s]) for s in own},
            "categories": {name: mean(rows) for name, rows in by_category.items() if rows},
            "overall": mean(benchmark)}


def score_checkpoint(checkpoint: Path, data: ExamData, tasks: dict, shots: int, prompt_format: tuple,
                     max_seq_len: int, batch_size: int, device: str, weights: str = "stored", lm=None,
                     execution: str = "auto") -> dict:
    """The summary and records of `checkpoint`; with `lm` (the first checkpoint's scorer, under
    --compare) its weights are loaded into that scorer's network, and its questions run through
    the graphs already compiled, where the shapes allow (loaded_model.reload_weights).
    "graphs_compiled" counts the graphs compiled (or loaded from the compile cache) for it, and
    "compile_seconds" is the part of "scoring_seconds" that took."""
    from .lm_adapter import MindSporeLM  # imported here: lm-eval, only once the exam data is checked

    chat_on, reason = prompt_format
    tokenizer = reload_weights(lm.net, Path(checkpoint), weights) if lm is not None else None
    if tokenizer is None:
        net, _, tokenizer = build_from_checkpoint(Path(checkpoint), max_seq_len, batch_size, device, weights)
        lm = MindSporeLM(net, load_tokenizer(tokenizer), max_seq_len, batch_size, execution=execution)
    else:
        lm.use_checkpoint(load_tokenizer(tokenizer))
    graphs, compiling = len(lm.compiled), lm.compile_seconds
    started = time.perf_counter()
    records, counts = score(lm, tasks, data, shots, chat_on)
    seconds = time.perf_counter() - started
    return {"checkpoint": str(checkpoint), "chat": chat_on, "chat_reason": reason, **counts,
            "scoring_seconds": seconds, "questions_per_second": len(records) / seconds,
            "graphs_compiled": len(lm.compiled) - graphs, "compile_seconds": lm.compile_seconds - compiling,
            **summarize(data.layout.task, records, {s: t.config.__dict__ for s, t in tasks.items()}, data.own),
            "records": records, "scorer": lm}


def run_exam(task: str, checkpoint: Path, data_dir: Optional[Path], shots: int = 5, split: Optional[str] = None,
             subjects: Optional[List[str]] = None, output: Optional[Path] = None, compare: Optional[Path] = None,
             chat: Optional[bool] = None, max_seq_len: int = 2048, batch_size: int = 4,
             device: str = "auto", compare_chat: Optional[bool] = None,
             weights: str = "stored", execution: str = "auto", own_files: List[Path] = ()) -> dict:
    """The summary of `checkpoint` (and of `compare`, with deltas) on the benchmark under
    `data_dir` and the user's `own_files`; every input is checked before a model is built,
    and --output is written only once everything is scored."""

    if shots < 0:
        raise RecordError(f"--shots {shots}: expected 0 or more")
    if output is not None and Path(output).exists():
        raise FileExistsError(f"--output {output} exists; remove it or choose another file")
    if output is not None:
        check_writable(Path(output), "--output")
    formats = prompt_formats(checkpoint, compare, chat, compare_chat)
    own = read_own_exams(task, own_files)
    data = read_exam(task, Path(data_dir) if data_dir else None, split, subjects, shots, own)
    for path in [checkpoint] + ([compare] if compare is not None else []):
        checkpoint_tokenizer(Path(path))  # a checkpoint eval cannot read: one line, before any model is built
    tasks = build_tasks(data)
    result = {"task": task, "split": data.split, "shots": shots, "data": str(data_dir) if data_dir else None,
              "own_exams": [str(p) for p in own_files], "max_seq_len": max_seq_len,
              **score_checkpoint(checkpoint, data, tasks, shots, formats[0], max_seq_len, batch_size, device, weights,
                                 execution=execution)}
    records, scorer = result.pop("records"), result.pop("scorer")
    if compare is not None:
        other = score_checkpoint(compare, data, tasks, shots, formats[1], max_seq_len, batch_size, device, weights,
                                 lm=scorer, execution=execution)
        other_records = other.pop("records")
        other.pop("scorer")
        result["compare"] = other
        result["delta"] = delta(result, other)
        for mine, theirs in zip(records, other_records):
            mine.compare = {k: v for k, v in asdict(theirs).items() if k in COMPARED}
    if output is not None:
        lines = "".join(json.dumps({k: v for k, v in asdict(r).items() if v is not None}, ensure_ascii=False) + "\n"
                        for r in records)
        replace_file(Path(output), lambda tmp: tmp.write_text(lines, encoding="utf-8"))
    return result


def delta(first: dict, second: dict) -> dict:
    """second - first, for every row both have, and what changed between them: the
    checkpoint, and the prompt format too where the two were scored in different ones."""
    def rows(a, b):
        return {k: {"acc": b[k]["acc"] - a[k]["acc"], "acc_norm": b[k]["acc_norm"] - a[k]["acc_norm"]}
                for k in a if k in b}

    return {"subjects": rows(first["subjects"], second["subjects"]), "own": rows(first["own"], second["own"]),
            "categories": rows(first["categories"], second["categories"]),
            "overall": rows({"overall": first["overall"]}, {"overall": second["overall"]})["overall"],
            "changed": ["checkpoint"] + (["prompt format"] if first["chat"] != second["chat"] else [])}
