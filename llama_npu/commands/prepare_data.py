"""`llama-npu prepare-data`: raw records tokenized into a MindRecord directory (data/prepare.py)."""
from __future__ import annotations

from pathlib import Path

from ..common.console import note
from ..data.formats import FORMATS, ON_BAD_RECORD
from ..data.tables import ReadOptions, parse_columns
from ..data.truncation import DEFAULT, MODES
from ..objectives import records_of, sft
from .arguments import check_ranges


def add_parser(subparsers) -> None:
    prep = subparsers.add_parser("prepare-data", help="tokenize raw data into a MindRecord directory")
    prep.add_argument("--format", required=True, choices=FORMATS,
                      help="alpaca: instruction/input/output; sharegpt: conversations or messages; "
                           "text: JSONL with a text field")
    prep.add_argument("--input", required=True, nargs="+", metavar="FILE",
                      help="JSON, JSONL, CSV, TSV, Excel .xlsx or Parquet files")
    prep.add_argument("--column", action="append", default=[], metavar="KEY=COLUMN",
                      help="read KEY from the column (or JSON key) COLUMN, e.g. --column instruction=指令 (a "
                           "recipe's data.columns); repeat for each")
    prep.add_argument("--encoding", default="", help="of CSV, TSV, JSON and JSONL files, e.g. gbk (default: UTF-8, "
                                                     "or UTF-16 by its BOM)")
    prep.add_argument("--output", required=True, metavar="DIR", help="directory to create")
    prep.add_argument("--tokenizer", default="llama3.2", help="llama3.2 or a path to a tokenizer.json")
    prep.add_argument("--max-seq-len", type=int, default=2048,
                      help="sequence length the model will see (a recipe's data.max_seq_len)")
    prep.add_argument("--truncation", choices=MODES, default=DEFAULT,
                      help="what is kept of a longer record (a recipe's data.truncation; default keep_end)")
    prep.add_argument("--pack", action="store_true", help="pack samples into full rows")
    prep.add_argument("--on-bad-record", choices=ON_BAD_RECORD, default="error",
                      help="stop at the first bad record, or skip it and count it by reason")
    prep.add_argument("--train-on-prompt", action="store_true", help="take the loss on every turn")
    prep.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    prep.add_argument("--workers", default="auto", metavar="N",
                      help="worker processes that tokenize and write, each a contiguous range of at least 50,000 "
                           "records (default auto: one for every 4 cores, at most 8)")
    prep.set_defaults(func=run)


def run(args) -> int:
    from ..data.prepare import format_report, prepare_dataset  # imported here: it loads numpy, --help does not
    from ..data.prepare_parts import workers_for
    from ..model.llama import MAX_POSITIONS

    check_ranges(args, {"max_seq_len": (lambda n: 1 <= n <= MAX_POSITIONS,
                                        f"1 to {MAX_POSITIONS} (Llama 3.2's context), as data.max_seq_len"),
                        "workers": (lambda n: n == "auto" or n.isdigit() and int(n) >= 1,
                                    "auto or 1 or more worker processes")})

    meta = prepare_dataset(args.format, args.input, Path(args.output), tokenizer=args.tokenizer,
                           max_seq_len=args.max_seq_len, packed=args.pack, on_bad_record=args.on_bad_record,
                           overwrite=args.overwrite, train_on_prompt=args.train_on_prompt,
                           progress=note, options=ReadOptions.of(parse_columns(args.column), args.encoding),
                           kind=records_of(sft.OBJECTIVE), workers=workers_for(args.workers), truncation=args.truncation)
    print(format_report(meta))
    print(f"wrote {args.output}")
    return 0
