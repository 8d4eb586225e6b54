"""What several commands share: train's and validate's options, the help of a checkpoint
to load and of the device to run on, and the exit code of bad input."""
from __future__ import annotations

BAD_INPUT = 2  # what argparse exits with on a bad argument: bad input of any kind exits the same

# What eval, generate and ms-to-hf take (pretrained.resolve_weights).
WEIGHTS_HELP = ("a directory written by convert hf-to-ms, a step directory (runs/X/checkpoints/step_N) or a "
                "run directory (its newest complete step); a LoRA run's adapters are folded into the base "
                "its recipe names (model.checkpoint)")
DEVICE_HELP = "where to run: auto picks ascend when MindSpore reports a usable Ascend device, else cpu"


def check_ranges(args, ranges: dict) -> None:
    """Refuses, in one line naming the flag, a numeric option outside its range: {attribute:
    (accepts(value), what it expects)}; an option left out (None) is not checked. argparse's
    type=int takes 0 and -3, which reached the code as a silent default or a shape error
    (generate --max-new-tokens -3 was an internal error)."""
    from ..data.errors import RecordError  # imported here: --help loads nothing it does not need

    for name, (accepts, what) in ranges.items():
        value = getattr(args, name)
        if value is not None and not accepts(value):
            raise RecordError(f"--{name.replace('_', '-')}: expected {what}, got {value}")


def add_device_argument(command) -> None:
    """eval's and generate's --device."""
    command.add_argument("--device", choices=("auto", "cpu", "ascend"), default="auto", help=DEVICE_HELP)


def add_weights_argument(command) -> None:
    """eval's and generate's --weights (evaluation/loaded_model.py held_weights)."""
    command.add_argument("--weights", choices=("stored", "fp16", "int8"), default="stored",
                         help="how the model's weights are held in memory: stored = as the directory holds them "
                              "(float as fp32; a `llama-npu quantize` directory stays int8, each layer dequantized "
                              "inside its forward), fp16, or int8 (a float checkpoint quantized at load)")


def add_run_arguments(command) -> None:
    """What train and validate both take: the run they start or check."""
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
