"""Alpaca records (`instruction`, optional `input`, `output`, optional `system`) from a
JSON array or JSON Lines file, as chat messages."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator, List, Tuple

from .chat_template import Message


class RecordError(ValueError):
    """A bad input record; the message starts with file:line."""


def _read_text(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")  # a UTF-8 BOM is accepted
    except UnicodeDecodeError as exc:
        raise RecordError(f"{path}: not UTF-8 (byte {exc.start}); if it is GBK, convert it first: "
                          f"iconv -f GBK -t UTF-8 {path} > {path.stem}.utf8{path.suffix}") from None


def _records(path: Path) -> Iterator[Tuple[int, object]]:
    """(line number, parsed JSON) for each record of a JSON array or JSONL file."""
    text = _read_text(path)
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RecordError(f"{path}:{exc.lineno}: malformed JSON array ({exc.msg})") from None
        # A JSON array has no per-record line; report the record's index (1-based) instead.
        yield from enumerate(items, start=1)
        return
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as exc:
            raise RecordError(f"{path}:{lineno}: malformed JSON ({exc.msg}); expected one "
                              f"object per line") from None


def _field(record: dict, key: str, where: str, required: bool) -> str:
    value = record.get(key, "")
    if not isinstance(value, str):
        raise RecordError(f"{where}: field '{key}' must be a string, got {type(value).__name__}")
    if required and not value.strip():
        raise RecordError(f"{where}: field '{key}' is missing or empty; expected a non-empty string")
    return value


def alpaca_to_messages(record: object, where: str) -> List[Message]:
    if not isinstance(record, dict):
        raise RecordError(f"{where}: expected a JSON object with 'instruction' and 'output'")
    instruction = _field(record, "instruction", where, required=True)
    extra = _field(record, "input", where, required=False)
    answer = _field(record, "output", where, required=True)
    system = _field(record, "system", where, required=False)
    prompt = f"{instruction}\n\n{extra}" if extra.strip() else instruction
    messages: List[Message] = [("system", system)] if system.strip() else []
    return messages + [("user", prompt), ("assistant", answer)]


def read_alpaca(paths) -> List[List[Message]]:
    conversations = []
    for path in map(Path, paths):
        if not path.is_file():
            raise RecordError(f"{path}: file not found")
        before = len(conversations)
        for lineno, record in _records(path):
            conversations.append(alpaca_to_messages(record, f"{path}:{lineno}"))
        if len(conversations) == before:
            raise RecordError(f"{path}: no records")
    return conversations
