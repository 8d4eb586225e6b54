"""A data file's text in its encoding. UTF-8 (with or without a BOM) and UTF-16 with its BOM
(Excel's "Unicode Text" export) are recognised by themselves; any other encoding is named
(data.encoding, prepare-data --encoding), since bytes that decode as GBK may as well be
Big5 or Shift-JIS read wrongly. A file that does not decode gets one line: where, which
encoding it does decode as when that is GBK, and a command that works for its format."""
from __future__ import annotations

import codecs
import shlex
from pathlib import Path
from typing import Callable, Optional

from .errors import RecordError

# Longest first: the UTF-8 BOM is no prefix of the UTF-16 ones, nor they of each other.
BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def convert_hint(path: Path, source: str) -> str:
    """How to read a file in `source` (GBK, or NAME when unknown): name its encoding, or
    convert it next to itself (the readers take the converted file in the same format: .csv
    stays .csv, .jsonl stays .jsonl)."""
    converted = path.with_name(f"{path.stem}.utf8{path.suffix}")
    return (f"read it with data.encoding: {source.lower()} (prepare-data --encoding {source.lower()}), or convert "
            f"it: iconv -f {source} -t UTF-8 {shlex.quote(str(path))} > {shlex.quote(str(converted))}")


def _decodes(raw: bytes, encoding: str) -> bool:
    try:
        raw.decode(encoding)
    except UnicodeDecodeError:
        return False
    return True


def decode_file(path: Path, encoding: str = "", hint: Optional[Callable[[Path, str], str]] = None) -> str:
    """The text of `path` in `encoding` ("": UTF-8, or UTF-16 by its BOM); `hint(path,
    source)` says how to fix a file that does not decode, in GBK or (source NAME) another
    encoding (default: convert_hint)."""
    raw = path.read_bytes()
    name = encoding or next((codec for bom, codec in BOMS if raw.startswith(bom)), "utf-8-sig")
    try:
        if codecs.lookup(name).name == "utf-8":  # a BOM is no text, however UTF-8 is named
            name = "utf-8-sig"
    except LookupError:  # prepare-data --encoding; a recipe's data.encoding is checked when it loads
        raise RecordError(f"{path}: unknown encoding {encoding!r}; expected a name such as gbk, big5, utf-16") \
            from None
    try:
        return raw.decode(name)
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        label = encoding or ("UTF-16" if name == "utf-16" else "UTF-8")
        # GB18030 is the superset of GBK that Windows' Chinese code page 936 exports decode as.
        gbk = encoding.lower() not in ("gbk", "gb18030") and _decodes(raw, "gb18030")
        how = (hint or convert_hint)(path, "GBK" if gbk else "NAME")
        looks = "; it decodes as GBK" if gbk else ""
        raise RecordError(f"{path}:{line}: not {label} (byte offset {exc.start}){looks}; {how}") from None
