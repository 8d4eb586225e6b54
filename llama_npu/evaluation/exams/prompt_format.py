"""Which prompt format (lm-eval's plain prompt or the Llama 3 chat format) each checkpoint of
`eval --task` is scored in, and why. With --compare both sides share one format unless the
user forces two, because a delta between two formats measures the checkpoint and the prompt
change at once."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Tuple

import yaml

from ...data.readers import RecordError

Format = Tuple[bool, str]  # (chat format on, why)


def chat_default(checkpoint: Path) -> Format:
    """(--chat default, why): on for a run directory (or its step) trained on chat data."""
    checkpoint = Path(checkpoint)
    for run in (checkpoint, checkpoint.parent.parent):
        if (run / "recipe.yaml").is_file():
            fmt = ((yaml.safe_load((run / "recipe.yaml").read_text(encoding="utf-8")) or {}).get("data") or {}) \
                .get("format", "alpaca")
            if fmt in ("alpaca", "sharegpt"):
                return True, f"a run trained on {fmt} data"
            return False, f"a run trained on {fmt} data"
    return False, "not a run directory"


def _flag(chat: bool, name: str) -> str:
    return f"--{name}" if chat else f"--no-{name}"


def shared_default(checkpoint: Path, compare: Path) -> Format:
    """Chat for both if either side is a run trained on chat data, plain otherwise."""
    sides = [("A", checkpoint, chat_default(checkpoint)), ("B", compare, chat_default(compare))]
    chat_sides = [f"{label} {path} is {why}" for label, path, (on, why) in sides if on]
    if chat_sides:
        return True, " and ".join(chat_sides)
    return False, "neither side is a run trained on chat data"


def prompt_formats(checkpoint: Path, compare: Optional[Path], chat: Optional[bool],
                   compare_chat: Optional[bool]) -> List[Format]:
    """[(chat, why) for the checkpoint, then for --compare if given]."""
    if compare is None:
        if compare_chat is not None:
            raise RecordError(f"{_flag(compare_chat, 'compare-chat')}: only with --compare")
        return [chat_default(checkpoint) if chat is None else (chat, _flag(chat, "chat"))]
    first = shared_default(checkpoint, compare) if chat is None else (chat, _flag(chat, "chat"))
    if compare_chat is None:
        return [first, first]
    return [first, (compare_chat, _flag(compare_chat, "compare-chat"))]
