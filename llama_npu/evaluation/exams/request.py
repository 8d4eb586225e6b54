"""What an `eval --task` command line asks for: its checks and defaults, then run.run_exam (which
imports lm-eval only once it runs)."""
from __future__ import annotations

from pathlib import Path

from ...data.readers import RecordError
from ..perplexity import DEFAULT_MAX_SEQ_LEN
from .own_exam import OWN_SUFFIXES
from .run import run_exam


def exam_request(args) -> dict:
    """The summary run_exam returns for the parsed `eval --task` arguments."""
    own = [Path(p) for p in args.data if Path(p).suffix.lower() in OWN_SUFFIXES]  # the user's own exams
    benchmark = [Path(p) for p in args.data if Path(p).suffix.lower() not in OWN_SUFFIXES]
    if len(benchmark) > 1:
        raise RecordError(f"--task {args.task}: --data takes one benchmark directory (and your own exams' .csv or "
                          f".jsonl files), got {len(benchmark)} directories")
    return run_exam(args.task, Path(args.checkpoint), benchmark[0] if benchmark else None,
                    5 if args.shots is None else args.shots,
                    args.split, args.subjects, Path(args.output) if args.output else None,
                    Path(args.compare) if args.compare else None, args.chat,
                    args.max_seq_len or DEFAULT_MAX_SEQ_LEN, args.batch_size, args.device, args.compare_chat, args.weights,
                    args.execution or "auto", own)
