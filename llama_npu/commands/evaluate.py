"""`llama-npu eval`: loss and perplexity of a checkpoint over records
(evaluation/perplexity.py), or its C-Eval / CMMLU / MMLU scores with --task
(evaluation/exams/request.py)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

from ..common.frameworks import quiet_frameworks
from ..data.formats import ON_BAD_RECORD
from ..data.readers import RecordError, first_record_is
from ..data.tables import ReadOptions
from ..evaluation.exams.report import format_summary
from ..evaluation.exams.request import exam_request
from ..evaluation.loaded_model import scoring_network
from ..evaluation.perplexity import evaluate_checkpoint
from ..model.llama import MAX_POSITIONS
from ..objectives import scoring
from ..recipe.stored import owning_recipe
from .arguments import WEIGHTS_HELP, add_device_argument, add_weights_argument, check_ranges

RECORDS_A_BATCH = 4
EXAM_OPTIONS = ("shots", "split", "subjects", "output", "compare", "chat", "compare_chat", "execution")


def add_parser(subparsers) -> None:
    ev = subparsers.add_parser("eval", help="loss and perplexity of a checkpoint over records, or its C-Eval / "
                                            "CMMLU / MMLU scores (--task)")
    ev.add_argument("--checkpoint", required=True, help=WEIGHTS_HELP + "; with --task also a Hugging Face directory")
    ev.add_argument("--data", required=True, nargs="+", metavar="FILE|DIR",
                    help="the records train reads: JSONL, JSON array, CSV, TSV, .xlsx or Parquet; text, alpaca or "
                         "ShareGPT (told apart by their keys), or preference pairs of a DPO run; a run's own "
                         "data.columns and data.encoding read them; with --task, the benchmark's directory in its "
                         "official CSV layout")
    ev.add_argument("--max-seq-len", type=int,
                    help="longer records are truncated (default: a run's own data.max_seq_len, so the loss is "
                         "its held-out loss; else 2048); each batch is padded only to the power-of-two bucket "
                         "(64 and up) of its longest record; with --task (default 2048), a longer prompt loses "
                         "shots first")
    ev.add_argument("--batch-size", type=int,
                    help=f"records (with --task: prompts) per forward pass (default: {RECORDS_A_BATCH}); preference "
                         f"pairs: pairs per forward pass (default: the run's train.micro_batch_size, so that scoring "
                         f"takes the memory training took)")
    ev.add_argument("--on-bad-record", choices=ON_BAD_RECORD,
                    help="a bad record stops eval naming its file and line (error), or is counted and left out, "
                         "the first few named (skip); default: the run's data.on_bad_record, else error")
    add_device_argument(ev)
    add_weights_argument(ev)
    ev.add_argument("--json", action="store_true", help="print one JSON object")
    exam = ev.add_argument_group("benchmarks (lm-eval's task definitions, local data)")
    exam.add_argument("--task", choices=("ceval", "cmmlu", "mmlu"),
                      help="score multiple-choice accuracy on the questions under --data")
    exam.add_argument("--shots", type=int, help="few-shot examples from the dev split (default 5; 0 needs no dev)")
    exam.add_argument("--split", help="split scored (default: lm-eval's: val for C-Eval, test for CMMLU and MMLU)")
    exam.add_argument("--subjects", nargs="+", metavar="SUBJECT", help="score only these subjects (file names "
                                                                     "without _<split>.csv)")
    exam.add_argument("--output", metavar="FILE.jsonl", help="one record per question: subject, id, question, "
                                                            "prompt_ids, choice_ids, logprobs, prediction, answer "
                                                            "(with --compare, the same for the second checkpoint)")
    exam.add_argument("--compare", metavar="CHECKPOINT",
                      help="score the same questions with a second checkpoint and print both with the deltas")
    exam.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                      help="put the prompts in the Llama 3 chat format the harness trains with (default: on for a "
                           "run directory trained on chat data, off otherwise; with --compare, on for both sides if "
                           "either is such a run, so that the delta measures the checkpoints only)")
    exam.add_argument("--compare-chat", action=argparse.BooleanOptionalAction, default=None,
                      help="score --compare's checkpoint in another format than the first (default: the same); the "
                           "deltas then mix two changes, and the summary says so")
    exam.add_argument("--execution", choices=("auto", "eager", "static", "dynamic"),
                      help="how the questions run (default auto: the fastest for this exam by the host's measured "
                           "rates, compiles included): op by op, through a compiled graph a padded width (the only "
                           "way on Ascend; MindSpore's compile cache keeps its graphs for the next run), or one graph "
                           "of dynamic shape (CPU)")
    ev.set_defaults(func=run)


def run(args) -> int:
    quiet_frameworks(Path(tempfile.gettempdir()) / "llama-npu-logs" / "eval")
    check_ranges(args, {"batch_size": (lambda n: n >= 1, "1 or more"),
                        "max_seq_len": (lambda n: 1 <= n <= MAX_POSITIONS, f"1 to {MAX_POSITIONS} (Llama 3.2's context)")})
    if args.task:
        return run_benchmark(args)
    given = [f"--{name.replace('_', '-')}" for name in EXAM_OPTIONS if getattr(args, name) is not None]
    if given:
        raise RecordError(f"{', '.join(given)}: only with --task ceval|cmmlu|mmlu")
    reading = run_reading(Path(args.checkpoint))
    objective = scoring(lambda kind: all(Path(f).is_file() and first_record_is(Path(f), kind, reading)
                                         for f in args.data))
    if objective is not None:  # records of an objective's own kind (DPO's pairs): its scores
        return run_objective(args, objective)
    result = evaluate_checkpoint(Path(args.checkpoint), args.data, args.max_seq_len,
                                 args.batch_size or RECORDS_A_BATCH, args.device, args.weights,
                                 bad_record_choice(args, owning_recipe(Path(args.checkpoint))))
    if args.json:
        print(json.dumps(result))
    else:
        print(f"loss {result['loss']:.4f} per target token, perplexity {result['perplexity']:.2f}, over "
              f"{result['target_tokens']} target tokens of {result['evaluated']} records "
              f"({result['truncated']} truncated at {result['max_seq_len']} tokens, {result['max_seq_len_from']}; "
              f"{result['dropped']} dropped)")
    return 0


def run_reading(checkpoint: Path) -> ReadOptions:
    """How `train` read the data of the run `checkpoint` belongs to (its data.columns and
    data.encoding), which eval --data reads the same way; the defaults for converted weights."""
    recipe = owning_recipe(checkpoint)
    return ReadOptions.of_data(recipe.data) if recipe else ReadOptions()


def bad_record_choice(args, recipe) -> str:
    """--on-bad-record, else the run's data.on_bad_record, else error."""
    return args.on_bad_record or (recipe.data.on_bad_record if recipe else "error")


def run_objective(args, objective) -> int:
    """eval of a run on records of its objective's kind (DPO's preference pairs), at the
    run's own data.max_seq_len, scored by the objective (objectives/ score)."""
    if args.max_seq_len is not None:
        raise RecordError(f"--max-seq-len: {objective.RECORDS.name} are scored at the run's own data.max_seq_len")
    checkpoint = Path(args.checkpoint)
    recipe = owning_recipe(checkpoint)
    if recipe is not None:  # the objective reads the held-out records as the run's recipe says
        recipe = dataclasses.replace(recipe, data=dataclasses.replace(recipe.data,
                                                                      on_bad_record=bad_record_choice(args, recipe)))
    result = objective.score(recipe, checkpoint, args.data, args.batch_size, args.device, scoring_network)
    print(json.dumps(result) if args.json else objective.score_line(result))
    return 0


def run_benchmark(args) -> int:
    """eval --task."""
    args.batch_size = args.batch_size or RECORDS_A_BATCH
    result = exam_request(args)
    print(json.dumps(result, ensure_ascii=False) if args.json else format_summary(result))
    if args.output and not args.json:
        print(f"wrote {args.output}")
    return 0
