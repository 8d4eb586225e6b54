"""`llama-npu quantize`: INT8 weight-only quantization of a converted checkpoint (weights/quantize.py)."""
from __future__ import annotations

from pathlib import Path


def add_parser(subparsers) -> None:
    quant = subparsers.add_parser("quantize", help="INT8 weight-only quantization of a converted checkpoint")
    quant.add_argument("--checkpoint", required=True, help="a directory written by convert hf-to-ms")
    quant.add_argument("--dst", required=True, help="directory to create")
    quant.set_defaults(func=run)


def run(args) -> int:
    from ..weights.quantize import quantize_checkpoint  # imported here: it loads numpy, which --help does not need

    report = quantize_checkpoint(Path(args.checkpoint), Path(args.dst))
    print(f"quantized {report['linear_layers']} linear layers: {report['bytes_before']:,} bytes -> "
          f"{report['bytes_after']:,} bytes ({report['bytes_after'] / report['bytes_before']:.1%}); wrote {args.dst}")
    return 0
