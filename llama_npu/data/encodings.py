"""A data file's text in its encoding. UTF-8 (with or without a BOM) and UTF-16 with its BOM
(Excel's "Unicode Text" export) are recognised by themselves; any other encoding is named
(data.encoding, prepare-data --encoding), since bytes that decode as GBK may as well be
Big5 or Shift-JIS read wrongly. A file that does not decode gets one line: where, which
encoding it does decode as when that is GBK, and a command that works for its format."""
from __future__ import annotations

import codecs
import io
import shlex
from pathlib import Path
from typing import Callable, Iterator, Optional

from .errors import RecordError

# Longest first: the UTF-8 BOM is no prefix of the UTF-16 ones, nor they of each other.
BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


BLOCK = 1 << 22  # bytes read at a time when a file is checked for its encoding


def convert_hint(path: Path, source: str) -> str:
    """How to read a file in `source` (GBK, or NAME when unknown): name its encoding, or
    convert it next to itself (the readers take the converted file in the same format: .csv
    stays .csv, .jsonl stays .jsonl)."""
    converted = path.with_name(f"{path.stem}.utf8{path.suffix}")
    return (f"read it with data.encoding: {source.lower()} (prepare-data --encoding {source.lower()}), or convert "
            f"it: iconv -f {source} -t UTF-8 {shlex.quote(str(path))} > {shlex.quote(str(converted))}")


def _codec(path: Path, encoding: str, head: bytes) -> str:
    """The codec that reads `path`, whose first bytes are `head`: `encoding`, or UTF-8, or
    UTF-16 by its BOM."""
    name = encoding or next((codec for bom, codec in BOMS if head.startswith(bom)), "utf-8-sig")
    try:
        if codecs.lookup(name).name == "utf-8":  # a BOM is no text, however UTF-8 is named
            name = "utf-8-sig"
    except LookupError:  # prepare-data --encoding; a recipe's data.encoding is checked when it loads
        raise RecordError(f"{path}: unknown encoding {encoding!r}; expected a name such as gbk, big5, utf-16") \
            from None
    return name


def _undecodable_at(path: Path, name: str) -> Optional[int]:
    """The byte offset where `path` stops decoding as `name`, or None if it decodes whole; read
    a block at a time, so that a file larger than memory is judged too."""
    decoder, offset = codecs.getincrementaldecoder(name)(), 0
    with open(path, "rb") as raw:
        while True:
            block = raw.read(BLOCK)
            pending = len(decoder.getstate()[0])  # bytes of a character cut at the last block's end
            try:
                decoder.decode(block, final=not block)
            except UnicodeDecodeError as exc:
                return offset - pending + exc.start
            if not block:
                return None
            offset += len(block)


def _undecodable(path: Path, name: str, encoding: str, hint) -> RecordError:
    """The one line for a file that does not decode as `name`: its line and byte offset, GBK
    when it decodes as that, and how to read or convert it."""
    start = _undecodable_at(path, name)
    with open(path, "rb") as raw:
        line = raw.read(start).count(b"\n") + 1 if start is not None else 1
    label = encoding or ("UTF-16" if name == "utf-16" else "UTF-8")
    # GB18030 is the superset of GBK that Windows' Chinese code page 936 exports decode as.
    gbk = encoding.lower() not in ("gbk", "gb18030") and _undecodable_at(path, "gb18030") is None
    how = (hint or convert_hint)(path, "GBK" if gbk else "NAME")
    looks = "; it decodes as GBK" if gbk else ""
    return RecordError(f"{path}:{line}: not {label} (byte offset {start}){looks}; {how}")


def decode_file(path: Path, encoding: str = "", hint: Optional[Callable[[Path, str], str]] = None) -> str:
    """The text of `path` in `encoding` ("": UTF-8, or UTF-16 by its BOM); `hint(path,
    source)` says how to fix a file that does not decode, in GBK or (source NAME) another
    encoding (default: convert_hint)."""
    raw = path.read_bytes()
    name = _codec(path, encoding, raw[:4])
    try:
        return raw.decode(name)
    except UnicodeDecodeError:
        raise _undecodable(path, name, encoding, hint) from None


def text_lines(path: Path, encoding: str = "", newline: Optional[str] = None) -> Iterator[str]:
    """The lines of `path` as decode_file would split its text, read as they are needed, so a
    file larger than memory streams. newline=None: lines end at \\n, \\r\\n or \\r (never at U+2028,
    which a JSON string may hold as it is), given ending in \\n; "": as they are, for csv."""
    with open(path, "rb") as raw:
        name = _codec(path, encoding, raw.peek(4)[:4])
        text = io.TextIOWrapper(raw, encoding=name, newline=newline)
        try:
            yield from text
        except UnicodeDecodeError:
            raise _undecodable(path, name, encoding, None) from None
