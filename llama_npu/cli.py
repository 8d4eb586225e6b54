"""Command-line parsing only: each sub-command calls one function elsewhere.

Exit codes: 0 success, 2 bad input (recipe, arguments, data, output directory), 1 a
failure during the run (non-finite streak, a checkpoint that cannot be written) or, for
`plan`, a plan that does not fit, 75 (stopping.PREEMPTED) training stopped by
SIGTERM/SIGINT after saving a checkpoint, 128+N signal N during start-up (nothing kept) or
a second signal (exit at once).
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
from pathlib import Path

from .checkpoints.merge import merge_shards
from .commands.plan import run_plan
from .common.console import note
from .common.frameworks import quiet_frameworks
from .common.launcher import is_scheduler, launched_workers
from .common.stopping import PREEMPTED, RunFailure, StopSignals
from .data.formats import FORMATS, ON_BAD_RECORD
from .evaluation.perplexity import DEFAULT_MAX_SEQ_LEN, evaluate_checkpoint
from .memory.devices import DEVICE_TARGETS, DeviceError
from .recipe.load import load_recipe
from .recipe.problems import RecipeError
from .recipe.stored import STORED_RECIPE, stored_recipe
from .selftest.doctor import diagnose
from .strategies.parallel import describe_layout, run_scheduler
from .training.rehearse import rehearse

BAD_INPUT = 2


def _fail(message: str) -> int:
    print(f"llama-npu: error: {message}", file=sys.stderr)
    return BAD_INPUT


def default_run_dir(args) -> Path:
    """--output-dir, else runs/<recipe name> (runs/<recipe name>-rehearsal with --rehearse)."""
    stem = Path(args.recipe).stem if args.recipe else ""
    return Path(args.output_dir or Path("runs") / (f"{stem}-rehearsal" if args.rehearse else stem))


def _run_request(args):
    """(recipe, run dir, rehearsal report or None, problems found while getting them) of a
    `train` or `validate` command line. With --resume and --output-dir and no recipe file,
    the recipe is the run's own recipe.yaml."""
    from .training.preflight import check_rehearsed_recipe  # imported here: it loads numpy, which --help does not need

    workers = getattr(args, "workers", None)  # validate --workers; train runs on the ones launched
    workers = launched_workers() if workers is None else workers
    if args.recipe is None:
        if not (args.resume and args.output_dir):
            raise RecipeError(f"{args.command}: name a recipe file, or pass --resume and --output-dir to "
                              f"continue a run with its own {STORED_RECIPE}")
        recipe = stored_recipe(Path(args.output_dir), args.set)
        if recipe is None:
            raise RecipeError(f"--output-dir {args.output_dir} has no {STORED_RECIPE} to resume with; "
                              f"name the recipe file")
    else:  # validate --workers N resolves strategies.parallel.data=auto as msrun's N workers will
        recipe = load_recipe(args.recipe, args.set, workers=workers)
    run_dir = default_run_dir(args)
    if not args.rehearse:
        return recipe, run_dir, None, []
    problems = check_rehearsed_recipe(recipe)
    rehearsal, shrunk, not_rehearsed = rehearse(recipe, workers)
    return rehearsal, run_dir, {"shrunk": shrunk, "not_rehearsed": not_rehearsed}, problems


def cmd_train(args) -> int:
    if is_scheduler():
        run_scheduler()
        return 0
    signals = StopSignals().start()  # before anything starts a thread: see StopSignals
    from .training.preflight import PreflightError, resume_command  # imported here, as train is: they load numpy
    from .training.run import format_summary, run_training

    recipe, run_dir, rehearsal, problems = _run_request(args)
    if problems:
        raise PreflightError(problems)
    if rehearsal:
        note(f"rehearsal on the CPU: {'; '.join(rehearsal['shrunk'])}")
        for item in rehearsal["not_rehearsed"]:
            note(f"not rehearsed: {item}")
    summary = run_training(recipe, run_dir, signals, resume=args.resume, overwrite=args.overwrite,
                           force=args.force, rehearsal=rehearsal)
    print(format_summary(summary))
    if summary["stopped_by"]:
        # Under msrun scripts/launch.sh prints the command that continues the whole launch.
        then = ("scripts/launch.sh prints the command that continues the launch" if "workers" in summary else
                f"continue with: {resume_command(run_dir, recipe)}")
        saved = f"newest checkpoint: {summary['checkpoint']}; " if summary["checkpoint"] else ""  # rank 0 saves
        print(f"llama-npu: stopped by {summary['stopped_by']} after step {summary['steps']}; {saved}{then}",
              file=sys.stderr)
        return PREEMPTED
    return 0


def cmd_prepare_data(args) -> int:
    from .data.prepare import format_report, prepare_dataset  # imported here: it loads numpy, which --help does not need

    meta = prepare_dataset(args.format, args.input, Path(args.output), tokenizer=args.tokenizer,
                           max_seq_len=args.max_seq_len, packed=args.pack, on_bad_record=args.on_bad_record,
                           overwrite=args.overwrite, train_on_prompt=args.train_on_prompt,
                           progress=note)
    print(format_report(meta))
    print(f"wrote {args.output}")
    return 0


def cmd_validate(args) -> int:
    from .training.preflight import check_output_dir, preflight  # imported here: it loads numpy, which --help does not need

    try:
        recipe, run_dir, rehearsal, problems = _run_request(args)
    except RecipeError as exc:  # no recipe to check the rest against; the output directory still
        problems = list(exc.problems)
        problems += check_output_dir(default_run_dir(args), args.resume, args.overwrite, args.rank == 0)[0]
        recipe = None
    if recipe is not None:  # train's checks with train's defaults: its output directory, one process
        workers = args.workers if args.workers is not None else launched_workers()
        problems += preflight(recipe, run_dir, args.resume, args.overwrite, args.force, workers,
                              main_rank=args.rank == 0, rehearsal=rehearsal is not None)[0]
    problems = list(dict.fromkeys(problems))  # a rehearsal checks the same files twice: each once
    for problem in problems:
        print(f"llama-npu: error: {problem}", file=sys.stderr)
    if problems:
        return BAD_INPUT
    print(f"{args.recipe or run_dir / 'recipe.yaml'}: valid{' as a rehearsal' if rehearsal else ''}; "
          f"{describe_layout(recipe)}")
    return 0


def cmd_merge(args) -> int:
    path = merge_shards(Path(args.run_dir), Path(args.dst), args.step)
    print(f"merged weights written to {path}")
    return 0


def cmd_plan(args) -> int:
    output, code = run_plan(args)
    print(output)
    return code


def cmd_doctor(args) -> int:
    lines, code = diagnose(Path(args.recipes))
    print("\n".join(lines))
    if code:
        print("llama-npu: error: this environment cannot train (see above)", file=sys.stderr)
    return code


def cmd_convert(args) -> int:
    from .weights.convert import hf_to_ms, ms_to_hf  # imported here: it loads numpy, which --help does not need

    if args.direction == "hf-to-ms":
        out = hf_to_ms(Path(args.src), Path(args.dst), args.dtype or "float32")
    else:
        out = ms_to_hf(Path(args.src), Path(args.dst), Path(args.weights) if args.weights else None, args.dtype,
                       merge_lora=args.merge_lora)
    print(f"wrote {out}")
    return 0


def cmd_eval(args) -> int:
    from .data.readers import RecordError  # imported here: readers loads the chat template, --help does not

    quiet_frameworks(Path(tempfile.gettempdir()) / "llama-npu-logs" / "eval")
    if args.task:
        return _eval_exam(args)
    given = [f"--{name.replace('_', '-')}" for name in EXAM_OPTIONS if getattr(args, name) is not None]
    if given:
        raise RecordError(f"{', '.join(given)}: only with --task ceval|cmmlu|mmlu")
    result = evaluate_checkpoint(Path(args.checkpoint), args.data, args.max_seq_len, args.batch_size, args.device)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"loss {result['loss']:.4f} per target token, perplexity {result['perplexity']:.2f}, over "
              f"{result['target_tokens']} target tokens of {result['evaluated']} records "
              f"({result['truncated']} truncated at {result['max_seq_len']} tokens, {result['max_seq_len_from']}; "
              f"{result['dropped']} dropped)")
    return 0


EXAM_OPTIONS = ("shots", "split", "subjects", "output", "compare", "chat")


def _eval_exam(args) -> int:
    from .data.readers import RecordError
    from .evaluation.exams.report import format_summary
    from .evaluation.exams.run import run_exam  # lm-eval and `datasets`, only when --task asks for them

    if len(args.data) != 1:
        raise RecordError(f"--task {args.task}: --data takes one directory, got {len(args.data)} paths")
    result = run_exam(args.task, Path(args.checkpoint), Path(args.data[0]), 5 if args.shots is None else args.shots,
                      args.split, args.subjects, Path(args.output) if args.output else None,
                      Path(args.compare) if args.compare else None, args.chat,
                      args.max_seq_len or DEFAULT_MAX_SEQ_LEN, args.batch_size,
                      args.device)
    print(json.dumps(result, ensure_ascii=False) if args.json else format_summary(result))
    if args.output and not args.json:
        print(f"wrote {args.output}")
    return 0


def cmd_generate(args) -> int:
    from .evaluation.generate import generate  # imported here: it loads numpy, which --help does not need

    quiet_frameworks(Path(tempfile.gettempdir()) / "llama-npu-logs" / "generate")
    generate(Path(args.checkpoint), args.prompt, args.system, args.max_new_tokens, greedy=not args.temperature,
             temperature=args.temperature or 1.0, top_p=args.top_p, seed=args.seed,
             on_text=lambda text: print(text, end="", flush=True), device=args.device)
    print()
    return 0


def cmd_quantize(args) -> int:
    from .weights.quantize import quantize_checkpoint  # imported here: it loads numpy, which --help does not need

    report = quantize_checkpoint(Path(args.checkpoint), Path(args.dst))
    print(f"quantized {report['linear_layers']} linear layers: {report['bytes_before']:,} bytes -> "
          f"{report['bytes_after']:,} bytes ({report['bytes_after'] / report['bytes_before']:.1%}); wrote {args.dst}")
    return 0


def cmd_profile(args) -> int:
    from .training.strategy_profile import format_result, run_profile  # imported here: it loads numpy (through train)

    recipe = Path(args.recipe)
    out = Path(args.out or Path("runs") / f"{recipe.stem}-profile")
    profile = run_profile(recipe, args.combos, args.steps, out, args.set)
    print(format_result(profile, out))
    return 0


def cmd_selftest(args) -> int:
    from .selftest.run import run_selftest

    if is_scheduler():  # msrun runs the command as its scheduler too (scripts/launch.sh --selftest)
        run_scheduler()
        return 0
    return run_selftest(args.device, args.json, args.speed)


DESCRIPTION = "Fine-tune Llama 3.2 1B/3B on Chinese data with MindSpore, on Ascend NPUs or the CPU."
EPILOG = """typical use:
  llama-npu doctor                                        what this machine can train
  llama-npu plan recipes/llama3_2_1b_zh_full_910a.yaml    will it fit the device?
  llama-npu train recipes/cpu_smoke.yaml                  fine-tune (runs/<recipe name>/)
  llama-npu eval --checkpoint runs/cpu_smoke/checkpoints/step_80 --data data/zh_instruct_eval.jsonl
run `llama-npu COMMAND --help` for a command's options and their defaults.
exit codes: 0 done, 1 the run failed, 2 bad input (nothing written), 75 stopped by a signal
after saving a checkpoint (continue with --resume auto)."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows each option's default, except where there is none to show."""

    def _get_help_string(self, action):
        if action.default in (None, False, [], argparse.SUPPRESS):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llama-npu", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="fine-tune from a YAML recipe")
    check = sub.add_parser("validate", help="run train's pre-flight checks and list every problem, without training")
    for command in (train, check):
        command.add_argument("recipe", nargs="?",
                             help="recipe YAML file (optional with --resume and --output-dir: the run's own "
                                  "recipe.yaml)")
        command.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                             help="override a recipe key, e.g. --set train.max_steps=20 (repeatable)")
        command.add_argument("--output-dir", help="run directory (default: runs/<recipe name>, "
                                                  "runs/<recipe name>-rehearsal with --rehearse)")
        command.add_argument("--resume", metavar="auto|PATH",
                             help="continue from the newest complete checkpoint (auto) or a step directory")
        command.add_argument("--overwrite", action="store_true",
                             help="delete an existing, non-empty output directory first (once every check passed)")
        command.add_argument("--force", action="store_true",
                             help="resume although the recipe changes the model, data, batch, seed, LoRA or layout")
        command.add_argument("--rehearse", action="store_true",
                             help="shrink the recipe to the tiny model on the CPU, keep its strategies, train a "
                                  "few steps, and say what was shrunk and what could not be rehearsed")
    train.set_defaults(func=cmd_train)
    check.add_argument("--workers", type=int, help="processes it will be launched on (default: 1, as a plain "
                                                   "`llama-npu train`)")
    check.add_argument("--rank", type=int, default=0, help="check as this rank does: only rank 0 judges the "
                                                           "output directory (scripts/launch.sh on nodes after 0)")
    check.set_defaults(func=cmd_validate)

    plan = sub.add_parser("plan", help="estimate device memory before a run, and find a plan that fits",
                          description="Estimate the memory each device needs for a recipe, component by "
                                      "component. Exit 0 when it fits (with --fit: when some plan fits), 1 when "
                                      "not, 2 on bad input.")
    plan.add_argument("recipe", nargs="?", help="recipe YAML file, planned on its own device and layout "
                                                "(or use --model)")
    plan.add_argument("--model", help="plan llama3.2-1b or llama3.2-3b with default settings instead of a recipe")
    plan.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a recipe key (repeatable); with --model, a key of its default recipe")
    plan.add_argument("--device", choices=tuple(DEVICE_TARGETS),
                      help="device to plan for; default: the recipe's device.name (required with --model)")
    plan.add_argument("--devices", type=int,
                      help="devices to plan for; default: the recipe's strategies.parallel data x model x "
                           "pipeline (data: auto is resolved from this count); with --model: data parallel over this "
                           "many (1 when not given)")
    plan.add_argument("--seq-len", type=int, help="tokens per sample; default: the recipe's data.max_seq_len "
                                                  "(2048 with --model)")
    plan.add_argument("--micro-batch", type=int, help="samples per micro-batch; default: the recipe's "
                                                      "train.micro_batch_size (1 with --model)")
    plan.add_argument("--device-memory", help="usable memory per device, e.g. 28GB (MindSpore's max_device_memory); "
                                              "default: the recipe's device.max_device_memory, else the device's")
    plan.add_argument("--task", choices=("train", "inference"), default="train",
                      help="plan fine-tuning, or serving one forward pass with a KV cache")
    plan.add_argument("--precision", choices=("fp32", "fp16", "bf16", "int8"),
                      help="with --task inference: the weights' precision (default fp16; bf16 needs a 910B)")
    plan.add_argument("--fit", action="store_true", help="search for the fastest plan that fits")
    plan.add_argument("--no-lora", action="store_true", help="with --fit: never switch to LoRA")
    plan.add_argument("--write-recipe", metavar="OUT.yaml", help="with --fit: write the recommended recipe")
    plan.add_argument("--data", nargs="+", metavar="FILE",
                      help="with --write-recipe: training files for the written recipe (replacing the recipe's; "
                           "required with --model); data.format is detected from their records")
    plan.add_argument("--eval-data", nargs="+", metavar="FILE",
                      help="with --write-recipe: held-out files for the written recipe's data.eval_files (in the "
                           "format of --data, detected from their records)")
    plan.add_argument("--overwrite", action="store_true", help="with --write-recipe: replace an existing file")
    plan.add_argument("--json", action="store_true", help="print one JSON object")
    plan.set_defaults(func=cmd_plan)

    # What eval, generate and ms-to-hf take (pretrained.resolve_weights).
    weights_help = ("a directory written by convert hf-to-ms, a step directory (runs/X/checkpoints/step_N) or a "
                    "run directory (its newest complete step); a LoRA run's adapters are folded into the base "
                    "its recipe names (model.checkpoint)")
    device_help = "where to run: auto picks ascend when MindSpore reports a usable Ascend device, else cpu"

    convert = sub.add_parser("convert", help="Hugging Face weights to MindSpore and back")
    convert.add_argument("direction", choices=("hf-to-ms", "ms-to-hf"),
                         help="hf-to-ms: a Hugging Face Llama 3.2 directory to a checkpoint recipes start from; "
                              "ms-to-hf: back to safetensors plus config and tokenizer files, for serving")
    convert.add_argument("--src", required=True,
                         help="hf-to-ms: a Hugging Face directory; ms-to-hf: " + weights_help)
    convert.add_argument("--dst", required=True, help="directory to create (must not exist)")
    convert.add_argument("--weights", help="ms-to-hf: a model.ckpt to export instead of --src's own "
                                           "(e.g. runs/x/checkpoints/step_N/model.ckpt)")
    convert.add_argument("--dtype", choices=("float32", "float16", "bfloat16"),
                         help="dtype written; unset: float32 for hf-to-ms, the dtype the weights were converted "
                              "from for ms-to-hf")
    convert.add_argument("--merge-lora", action="store_true",
                         help="ms-to-hf: --weights holds LoRA adapters; fold them into --src's base weights")
    convert.set_defaults(func=cmd_convert)

    ev = sub.add_parser("eval", help="loss and perplexity of a checkpoint over JSONL records, or its C-Eval / "
                                     "CMMLU / MMLU scores (--task)")
    ev.add_argument("--checkpoint", required=True, help=weights_help + "; with --task also a Hugging Face directory")
    ev.add_argument("--data", required=True, nargs="+", metavar="FILE|DIR",
                    help="JSONL or JSON-array records: text, alpaca or ShareGPT (told apart by their keys); with "
                         "--task, the benchmark's directory in its official CSV layout")
    ev.add_argument("--max-seq-len", type=int,
                    help="longer records are truncated (default: a run's own data.max_seq_len, so the loss is "
                         "its held-out loss; else 2048); each batch is padded only to the power-of-two bucket "
                         "(64 and up) of its longest record; with --task (default 2048), a longer prompt loses "
                         "shots first")
    ev.add_argument("--batch-size", type=int, default=4, help="records (with --task: prompts) per forward pass")
    ev.add_argument("--device", choices=("auto", "cpu", "ascend"), default="auto", help=device_help)
    ev.add_argument("--json", action="store_true", help="print one JSON object")
    exam = ev.add_argument_group("benchmarks (lm-eval's task definitions, local data)")
    exam.add_argument("--task", choices=("ceval", "cmmlu", "mmlu"),
                      help="score multiple-choice accuracy on the questions under --data")
    exam.add_argument("--shots", type=int, help="few-shot examples from the dev split (default 5; 0 needs no dev)")
    exam.add_argument("--split", help="split scored (default: lm-eval's: val for C-Eval, test for CMMLU and MMLU)")
    exam.add_argument("--subjects", nargs="+", metavar="SUBJECT", help="score only these subjects (file names "
                                                                     "without _<split>.csv)")
    exam.add_argument("--output", metavar="FILE.jsonl", help="one record per question: subject, id, prompt_ids, "
                                                            "choice_ids, logprobs, prediction, answer")
    exam.add_argument("--compare", metavar="CHECKPOINT",
                      help="score the same questions with a second checkpoint and print both with the deltas")
    exam.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                      help="put the prompts in the Llama 3 chat format the harness trains with (default: on for a "
                           "run directory trained on chat data, off otherwise)")
    ev.set_defaults(func=cmd_eval)

    gen = sub.add_parser("generate", help="a chat reply from a checkpoint, streamed")
    gen.add_argument("--checkpoint", required=True, help=weights_help)
    gen.add_argument("--prompt", required=True, help="the user turn")
    gen.add_argument("--system", help="a system turn before it")
    gen.add_argument("--max-new-tokens", type=int, default=128, help="stop after this many tokens")
    mode = gen.add_mutually_exclusive_group()
    mode.add_argument("--greedy", action="store_true", help="argmax decoding (what happens without --temperature)")
    mode.add_argument("--temperature", type=float, help="sample at this temperature instead of greedy decoding")
    gen.add_argument("--top-p", type=float, default=1.0, help="with --temperature: nucleus sampling threshold")
    gen.add_argument("--seed", type=int, default=0, help="with --temperature: sampling seed")
    gen.add_argument("--device", choices=("auto", "cpu", "ascend"), default="auto", help=device_help)
    gen.set_defaults(func=cmd_generate)

    quant = sub.add_parser("quantize", help="INT8 weight-only quantization of a converted checkpoint")
    quant.add_argument("--checkpoint", required=True, help="a directory written by convert hf-to-ms")
    quant.add_argument("--dst", required=True, help="directory to create")
    quant.set_defaults(func=cmd_quantize)

    doctor = sub.add_parser("doctor", help="what this machine can train")
    doctor.add_argument("--recipes", default=str(Path(__file__).resolve().parent.parent / "recipes"),
                        help="directory of recipes to judge (default: the shipped ones)")
    doctor.set_defaults(func=cmd_doctor)

    selftest = sub.add_parser("selftest", help="prove each Ascend-only path on this device in minutes, "
                                                "each check against a reference computed in the same run")
    selftest.add_argument("--device", default="auto", choices=("auto", "cpu", "ascend"),
                          help="auto: the NPU when there is one, else the CPU")
    selftest.add_argument("--json", metavar="FILE", help="also write the device and every check as JSON "
                                                         "(attach it to a bug report)")
    selftest.add_argument("--speed", action="store_true", help="also time a 1B step (tokens/s, MFU)")
    selftest.set_defaults(func=cmd_selftest)

    prof = sub.add_parser("profile", help="train the recipe under each strategy combination and measure it")
    prof.add_argument("recipe", help="recipe YAML file")
    prof.add_argument("--combos", metavar="SPEC",
                      help="axes and values, e.g. 'precision=O0,O2;accumulation=1,4;recompute=off,on;"
                           "chunked_ce=off,on;lora=off,on' (the default matrix) or any recipe key, e.g. "
                           "'train.micro_batch_size=1,2,4'")
    prof.add_argument("--steps", type=int, default=5, help="timed steps after the compiling first (default 5)")
    prof.add_argument("--out", metavar="DIR", help="output directory (default: runs/<recipe name>-profile)")
    prof.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a recipe key in every combination (repeatable)")
    prof.set_defaults(func=cmd_profile)

    merge = sub.add_parser("merge-checkpoints", help="merge the per-rank shards of a sharded run")
    merge.add_argument("run_dir", help="the run's output directory")
    merge.add_argument("--step", type=int, help="step to merge (default: newest complete on every rank)")
    merge.add_argument("--dst", required=True, help="a .ckpt file to write, or a directory to create (model.ckpt "
                                                    "and config.json: what eval, generate and convert ms-to-hf take)")
    merge.set_defaults(func=cmd_merge)

    prep = sub.add_parser("prepare-data", help="tokenize raw data into a MindRecord directory")
    prep.add_argument("--format", required=True, choices=FORMATS,
                      help="alpaca: instruction/input/output; sharegpt: conversations or messages; "
                           "text: JSONL with a text field")
    prep.add_argument("--input", required=True, nargs="+", metavar="FILE", help="JSON or JSONL files")
    prep.add_argument("--output", required=True, metavar="DIR", help="directory to create")
    prep.add_argument("--tokenizer", default="llama3.2", help="llama3.2 or a path to a tokenizer.json")
    prep.add_argument("--max-seq-len", type=int, default=2048,
                      help="sequence length the model will see (a recipe's data.max_seq_len)")
    prep.add_argument("--pack", action="store_true", help="pack samples into full rows")
    prep.add_argument("--on-bad-record", choices=ON_BAD_RECORD, default="error",
                      help="stop at the first bad record, or skip it and count it by reason")
    prep.add_argument("--train-on-prompt", action="store_true", help="take the loss on every turn")
    prep.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    prep.set_defaults(func=cmd_prepare_data)
    for choice in sub._choices_actions:  # each command's --help opens with its one-line summary
        command = sub.choices[choice.dest]
        command.formatter_class, command.description = HelpFormatter, command.description or choice.help
    return parser


def user_errors() -> tuple:
    """What bad input raises, from any command: one line and exit 2, never a traceback."""
    # Imported when a command fails, not at start: the weights format and preflight load numpy.
    from .checkpoints.files import CheckpointError
    from .checkpoints.merge import MergeError
    from .common.atomic import UnwritableError
    from .data.readers import RecordError
    from .data.tokenizer import TokenizerError
    from .selftest.run import SelftestError
    from .training.preflight import PreflightError, RunDirError
    from .weights.tensor_files import ConvertError

    return (RecipeError, RunDirError, PreflightError, RecordError, TokenizerError, CheckpointError, ConvertError,
            MergeError, DeviceError, FileExistsError, FileNotFoundError, SelftestError, UnwritableError)


class Terminated(BaseException):
    """SIGTERM in a command other than train (which blocks it and takes it itself): unwound
    like Ctrl-C, so an output being staged (atomic.staged_directory) is removed, not left as a
    hidden .NAME.partial-PID directory the size of the model."""


def _terminated(signum, frame):
    raise Terminated()


def main(argv=None) -> int:
    signal.signal(signal.SIGTERM, _terminated)
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except user_errors() as exc:
        return _fail(str(exc))
    except RunFailure as exc:
        print(f"llama-npu: error: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Terminated) as exc:  # in a command other than train (it takes its signals itself)
        number = signal.SIGINT if isinstance(exc, KeyboardInterrupt) else signal.SIGTERM
        print(f"llama-npu: error: interrupted ({number.name})", file=sys.stderr)
        return 128 + number


if __name__ == "__main__":
    raise SystemExit(main())
