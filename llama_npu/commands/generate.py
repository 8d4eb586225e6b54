"""`llama-npu generate`: a chat reply from a checkpoint, streamed (evaluation/generate.py)."""
from __future__ import annotations

import tempfile
from pathlib import Path

from ..common.frameworks import quiet_frameworks
from .arguments import WEIGHTS_HELP, add_device_argument, add_weights_argument, check_ranges


def add_parser(subparsers) -> None:
    gen = subparsers.add_parser("generate", help="a chat reply from a checkpoint, streamed")
    gen.add_argument("--checkpoint", required=True, help=WEIGHTS_HELP)
    gen.add_argument("--prompt", required=True, help="the user turn")
    gen.add_argument("--system", help="a system turn before it")
    gen.add_argument("--max-new-tokens", type=int, default=128, help="stop after this many tokens")
    mode = gen.add_mutually_exclusive_group()
    mode.add_argument("--greedy", action="store_true", help="argmax decoding (what happens without --temperature)")
    mode.add_argument("--temperature", type=float, help="sample at this temperature instead of greedy decoding")
    gen.add_argument("--top-p", type=float, default=1.0, help="with --temperature: nucleus sampling threshold")
    gen.add_argument("--seed", type=int, default=0, help="with --temperature: sampling seed")
    add_device_argument(gen)
    add_weights_argument(gen)
    gen.set_defaults(func=run)


def run(args) -> int:
    from ..evaluation.generate import generate  # imported here: it loads numpy, which --help does not need

    check_ranges(args, {"max_new_tokens": (lambda n: n >= 1, "1 or more"),
                        "temperature": (lambda t: t > 0, "a value > 0 (leave it out for greedy decoding)"),
                        "top_p": (lambda p: 0 < p <= 1, "a value in (0, 1]")})
    quiet_frameworks(Path(tempfile.gettempdir()) / "llama-npu-logs" / "generate")
    generate(Path(args.checkpoint), args.prompt, args.system, args.max_new_tokens, greedy=not args.temperature,
             temperature=args.temperature or 1.0, top_p=args.top_p, seed=args.seed,
             on_text=lambda text: print(text, end="", flush=True), device=args.device, weights=args.weights)
    print()
    return 0
