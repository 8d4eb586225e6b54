"""`llama-npu convert`: Hugging Face weights to MindSpore and back (weights/convert.py)."""
from __future__ import annotations

from pathlib import Path

from .arguments import WEIGHTS_HELP


def add_parser(subparsers) -> None:
    convert = subparsers.add_parser("convert", help="Hugging Face weights to MindSpore and back")
    convert.add_argument("direction", choices=("hf-to-ms", "ms-to-hf"),
                         help="hf-to-ms: a Hugging Face Llama 3.2 directory to a checkpoint recipes start from; "
                              "ms-to-hf: back to safetensors plus config and tokenizer files, for serving")
    convert.add_argument("--src", required=True,
                         help="hf-to-ms: a Hugging Face directory; ms-to-hf: " + WEIGHTS_HELP)
    convert.add_argument("--dst", required=True, help="directory to create (must not exist)")
    convert.add_argument("--weights", help="ms-to-hf: a model.ckpt to export instead of --src's own "
                                           "(e.g. runs/x/checkpoints/step_N/model.ckpt)")
    convert.add_argument("--dtype", choices=("float32", "float16", "bfloat16"),
                         help="dtype written; unset: float32 for hf-to-ms; for ms-to-hf, a run's checkpoint in the "
                              "dtype of the model it started from (its torch_dtype), or, from random weights or an "
                              "fp32 model, the dtype it computed in; a converted directory in the dtype it was "
                              "converted from")
    convert.add_argument("--merge-lora", action="store_true",
                         help="ms-to-hf: --weights holds LoRA adapters; fold them into --src's base weights")
    convert.set_defaults(func=run)


def run(args) -> int:
    from ..weights.convert import hf_to_ms, ms_to_hf  # imported here: it loads numpy, which --help does not need

    if args.direction == "hf-to-ms":
        out = hf_to_ms(Path(args.src), Path(args.dst), args.dtype or "float32")
    else:
        out = ms_to_hf(Path(args.src), Path(args.dst), Path(args.weights) if args.weights else None, args.dtype,
                       merge_lora=args.merge_lora)
    print(f"wrote {out}")
    return 0
