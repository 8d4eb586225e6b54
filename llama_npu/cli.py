"""The command line: the top-level parser, one sub-command a module of commands/ (each adding
its own arguments and calling one function elsewhere), and what a failure exits with.

Exit codes: 0 success, 2 bad input (recipe, arguments, data, output directory), 1 a
failure during the run (non-finite streak, a checkpoint that cannot be written; an internal
error, printed as one line naming the file that holds its traceback) or, for
`plan`, a plan that does not fit, 75 (stopping.PREEMPTED) training stopped by
SIGTERM/SIGINT after saving a checkpoint, 128+N signal N during start-up (nothing kept) or
a second signal (exit at once).
"""
from __future__ import annotations

import argparse
import signal
import sys

from .commands import (convert, doctor, evaluate, generate, merge_checkpoints, plan, prepare_data, quantize, report,
                       selftest, strategy_profile, train, validate)
from .commands.arguments import BAD_INPUT
from .common.stopping import RunFailure
from .memory.devices import DeviceError
from .recipe.problems import RecipeError

# In the order --help lists them.
COMMANDS = (train, validate, plan, convert, evaluate, generate, quantize, doctor, selftest, strategy_profile,
            merge_checkpoints, prepare_data, report)


def _fail(message: str) -> int:
    print(f"llama-npu: error: {message}", file=sys.stderr)
    return BAD_INPUT


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
    for command in COMMANDS:
        command.add_parser(sub)
    for choice in sub._choices_actions:  # each command's --help opens with its one-line summary
        command_parser = sub.choices[choice.dest]
        command_parser.formatter_class = HelpFormatter
        command_parser.description = command_parser.description or choice.help
    return parser


def user_errors() -> tuple:
    """What bad input raises, from any command: one line and exit 2, never a traceback."""
    # Imported when a command fails, not at start: the weights format and the selftest load numpy.
    from .checkpoints.files import CheckpointError
    from .weights.merge_checkpoints import MergeError
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
    except Exception as exc:  # noqa: BLE001 -- a defect of ours, not the input's: one line, the rest in a file
        return _internal_error(exc)


def _internal_error(exc: Exception) -> int:
    """One line saying so, and where the full traceback is. What the command was writing is
    already unwound (common/atomic.staged_directory removes a staged output on any exception),
    so nothing that existed is touched."""
    import tempfile
    import traceback

    full = "".join(traceback.format_exception(exc))
    try:
        fd, path = tempfile.mkstemp(prefix="llama-npu-traceback-", suffix=".txt")
        with open(fd, "w", encoding="utf-8") as fh:
            fh.write(f"llama-npu {' '.join(sys.argv[1:])}\n\n{full}")
    except OSError:  # no writable temporary directory: the traceback on the console is all there is
        print(full, file=sys.stderr, end="")
        path = "the lines above"
    # MindSpore's messages run over many lines (a C++ stack follows what failed): one line, its head
    message = " ".join(str(exc).split())
    message = message if len(message) <= 300 else message[:300] + "..."
    print(f"llama-npu: error: internal error, not a problem of your input: {type(exc).__name__}: {message} "
          f"(the full traceback is in {path}; please report it with that file)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
