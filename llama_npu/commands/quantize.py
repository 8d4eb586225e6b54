"""`llama-npu quantize`: INT8 weight-only quantization of a checkpoint (weights/quantize.py);
with --data, its accuracy cost (evaluation/quantization_cost.py)."""
from __future__ import annotations

import tempfile
from pathlib import Path

from ..common.frameworks import quiet_frameworks
from .arguments import WEIGHTS_HELP, add_device_argument


def add_parser(subparsers) -> None:
    quant = subparsers.add_parser("quantize", help="INT8 weight-only quantization of a checkpoint: converted, a run's "
                                                   "step or a run")
    quant.add_argument("--checkpoint", required=True, help=WEIGHTS_HELP)
    quant.add_argument("--dst", required=True, help="directory to create")
    cost = quant.add_argument_group("accuracy cost (eval's loss and, with --task, eval --task --compare)")
    cost.add_argument("--data", nargs="+", metavar="FILE",
                      help="held-out records, in any layout eval --data reads: report the loss and perplexity of the float and "
                           "the int8 model side by side")
    cost.add_argument("--task", choices=("ceval", "cmmlu", "mmlu"),
                      help="also score both models on this benchmark's questions under --task-data")
    cost.add_argument("--task-data", metavar="DIR", help="the benchmark's directory in its official CSV layout "
                                                         "(as eval --task --data takes it)")
    cost.add_argument("--shots", type=int, default=5, help="few-shot examples of --task")
    cost.add_argument("--max-seq-len", type=int,
                      help="as eval's (default: a run's own data.max_seq_len for the loss, 2048 for --task)")
    cost.add_argument("--batch-size", type=int, default=4, help="records (prompts) per forward pass")
    add_device_argument(quant)
    quant.set_defaults(func=run)


def run(args) -> int:
    quiet_frameworks(Path(tempfile.gettempdir()) / "llama-npu-logs" / "quantize")
    from ..evaluation import quantization_cost as cost  # imported here: it loads the exam code, --help needs none

    task_data = Path(args.task_data) if args.task_data else None
    cost.check_inputs(args.data, args.task, task_data, args.shots)
    from ..weights.quantize import quantize_checkpoint  # imported here: MindSpore, once the inputs are checked
    report = quantize_checkpoint(Path(args.checkpoint), Path(args.dst))
    print(f"quantized {report['linear_layers']} linear layers: {report['bytes_before']:,} bytes -> "
          f"{report['bytes_after']:,} bytes ({report['bytes_after'] / report['bytes_before']:.1%}); wrote {args.dst}")
    if args.data:
        print(cost.format_held_out(cost.held_out_cost(Path(args.checkpoint), Path(args.dst), args.data,
                                                      args.max_seq_len, args.batch_size, args.device)))
    if args.task:
        print(cost.format_exam(cost.exam_cost(Path(args.checkpoint), Path(args.dst), args.task, task_data,
                                              args.shots, args.max_seq_len, args.batch_size, args.device)))
    return 0
