"""`llama-npu plan`: device memory before a run, and a plan that fits (memory/plan_report.py
estimates and writes it)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..common.atomic import check_writable
from ..memory.devices import DEVICE_TARGETS
from ..memory.fit_choice import MAXIMIZE
from ..memory.plan_report import run_plan
from ..memory.step_time import DEFAULT_MFU, MFU_SOURCE
from ..strategies.offload import DEFAULT_HOST_BANDWIDTH


def add_parser(subparsers) -> None:
    plan = subparsers.add_parser("plan", help="estimate device memory before a run, and find a plan that fits",
                                 description="Estimate the memory each device needs for a recipe, component by "
                                             "component. Exit 0 when it fits (with --fit: when some plan fits), 1 "
                                             "when not, 2 on bad input.")
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
    plan.add_argument("--fit", action="store_true",
                      help="a plan that fits: kept as given; else (or when --devices breaks the layout) the plan "
                           "that fits with the fewest changes, on a layout run on an NPU where one fits")
    plan.add_argument("--maximize", choices=MAXIMIZE,
                      help="with --fit: search even when the plan fits, for the largest micro-batch, the longest "
                           "sequence or the shortest predicted step a token (the step time plan prints)")
    plan.add_argument("--no-lora", action="store_true", help="with --fit: never switch to LoRA")
    plan.add_argument("--no-offload", action="store_true",
                      help="with --fit: never move the optimizer to the host (strategies.offload), e.g. on a host "
                           "without the memory")
    plan.add_argument("--write-recipe", metavar="OUT.yaml", help="with --fit: write the recommended recipe")
    plan.add_argument("--data", nargs="+", metavar="FILE",
                      help="with --write-recipe: training files for the written recipe (replacing the recipe's; "
                           "required with --model); data.format is detected from their records")
    plan.add_argument("--eval-data", nargs="+", metavar="FILE",
                      help="with --write-recipe: held-out files for the written recipe's data.eval_files (in the "
                           "format of --data, detected from their records)")
    plan.add_argument("--overwrite", action="store_true", help="with --write-recipe: replace an existing file")
    plan.add_argument("--host-bandwidth", type=float, default=DEFAULT_HOST_BANDWIDTH, metavar="GB/S",
                      help="with the optimizer on the host (strategies.offload): the host memory bandwidth one rank's "
                           f"update gets, in 10^9 bytes/s, for its time a step (default {DEFAULT_HOST_BANDWIDTH:g}: "
                           "a 2-core x86_64 host's streaming add; benchmarks/host_optimizer.py measures yours)")
    plan.add_argument("--mfu", type=float, metavar="FRACTION",
                      help=f"the fraction of the chip's peak the card's compute reaches, for the predicted step time "
                           f"(default {DEFAULT_MFU:g}: {MFU_SOURCE})")
    plan.add_argument("--peak-tflops", type=float, metavar="TFLOPS",
                      help="the chip's peak matmul TFLOPS in the compute dtype, for the step time; default: "
                           "llama_npu/memory/peaks.py's, each with its source (a device without one, such as the "
                           "910B4 or the CPU, has an unknown compute time until this is given)")
    plan.add_argument("--json", action="store_true", help="print one JSON object")
    plan.add_argument("--plot", metavar="FILE.png", help="also draw the plan: each phase's memory by component "
                                                         "against the usable memory (llama_npu/report/plan_picture.py)")
    plan.set_defaults(func=run)


def json_arguments(recipe: Path) -> argparse.Namespace:
    """What `plan RECIPE --json` parses, every default as the command line gives it: `report`
    hands it to report/ to plan a run's stored recipe."""
    parser = argparse.ArgumentParser(prog="llama-npu")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["plan", str(recipe), "--json"])


def run(args) -> int:
    if args.plot:
        check_writable(Path(args.plot), "--plot")
    output, code = run_plan(args)
    print(output)
    if args.plot:
        from ..report.plan_picture import draw_plan  # imported here: matplotlib, only to draw

        print(draw_plan(args), file=sys.stderr if args.json else sys.stdout)
    return code
