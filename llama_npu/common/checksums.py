"""Checksums of the directories llama-npu writes, checked before a command uses a byte of them.

Every directory a later command reads -- a checkpoint step (checkpoints/files.py), a
converted one (convert hf-to-ms, and ms-to-hf's export), a quantized one, a merged one and
a prepared dataset (prepare-data) -- gets `checksums.json`, written last into its staging
directory: each file's byte size and CRC-32, the command that made it, and a CRC-32 of that
record itself, so that a flipped byte in any file, the manifest included, is found and named.

Directories written before the manifest existed are still read: a step's files by the sizes
and CRC-32 its state.json recorded, a .ckpt by the CRC-32 MindSpore appends to it
(b"crc_num" and 10 big-endian bytes over everything before them: _exec_save and
_parse_ckpt_proto in mindspore/train/serialization.py); what neither covers is named in a
warning and read unverified.

The CRC-32 pass costs about a quarter of mindspore.load_checkpoint's read of the same file
(benchmarks/verified_reads.py printed 0.26; docs/checkpoints-and-resume.md). A leaf module: zlib and json.
"""
from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

MANIFEST = "checksums.json"
_FORMAT = "llama-npu checksums 1"
_TRAILER = b"crc_num"  # MindSpore's .ckpt CRC trailer: this tag, then a 10-byte big-endian CRC-32
_TRAILER_BYTES = len(_TRAILER) + 10
_SOUND: set = set()  # (file, size, mtime, crc) already verified in this process: eval resolves a checkpoint twice


def file_crc32(path: Path, length: Optional[int] = None) -> int:
    """CRC-32 of `path`'s first `length` bytes (all of it by default), streamed through one
    reused buffer (a third faster than fresh reads: benchmarks/verified_reads.py)."""
    crc, left = 0, length
    buffer = bytearray(1 << 24)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as fh:
        while left is None or left > 0:
            read = fh.readinto(view if left is None or left >= len(buffer) else view[:left])
            if not read:
                break
            crc = zlib.crc32(view[:read], crc)
            left = None if left is None else left - read
    return crc


def _sealed(record: dict) -> int:
    return zlib.crc32(json.dumps(record, sort_keys=True, separators=(",", ":")).encode())


def write_manifest(directory: Path, made_by: str, known: Optional[Dict[str, int]] = None) -> None:
    """`directory`/checksums.json over every file in it; `known`: name -> CRC-32 already
    computed while writing (not read again)."""
    directory, known = Path(directory), known or {}
    files = {}
    for path in sorted(directory.iterdir()):
        if path.is_file() and path.name != MANIFEST:
            files[path.name] = {"bytes": path.stat().st_size,
                                "crc32": known[path.name] if path.name in known else file_crc32(path)}
    record = {"format": _FORMAT, "made_by": made_by, "files": files}
    with open(directory / MANIFEST, "w", encoding="utf-8") as fh:
        json.dump(dict(record, crc32=_sealed(record)), fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())


@dataclass
class Verdict:
    """What checking some files of a directory found."""
    problem: Optional[str] = None  # the first damage, naming the file; None: sound
    unverified: List[str] = field(default_factory=list)  # files read that no checksum covers
    made_by: Optional[str] = None  # the command that wrote the directory (from an intact manifest)
    has_manifest: bool = False


def read_manifest(directory: Path) -> Tuple[Optional[dict], Optional[str]]:
    """(the manifest, None), (None, None) when there is none, or (None, why it is damaged)."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return None, None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        sealed = record.pop("crc32")
        ok = record["format"] == _FORMAT and sealed == _sealed(record) and all(
            isinstance(e["bytes"], int) and isinstance(e["crc32"], int) for e in record["files"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        ok = False
    if not ok:
        return None, f"{path} is damaged (it no longer matches the CRC-32 it was sealed with)"
    return record, None


def listed(directory: Path) -> List[str]:
    """The files an intact manifest of `directory` covers; none when it has none (or a
    damaged one, which check() reports)."""
    manifest, _ = read_manifest(directory)
    return sorted(manifest["files"]) if manifest else []


def _file_problem(path: Path, size: int, crc: int, whose: str, length: Optional[int] = None) -> Optional[str]:
    if not path.is_file():
        return f"{path} is missing ({whose} lists it)"
    stat = path.stat()
    if stat.st_size != size:
        return f"{path} has {stat.st_size:,} bytes, {whose} recorded {size:,} (cut short or overwritten)"
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, crc)
    if key in _SOUND:
        return None
    try:
        actual = file_crc32(path, length)
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror})"
    if actual != crc:
        return f"{path} is damaged or unreadable (its CRC-32 differs from the one {whose} recorded)"
    _SOUND.add(key)
    return None


def trailer(path: Path) -> Optional[Tuple[int, int]]:
    """(CRC-32, bytes it covers) of a .ckpt's MindSpore trailer, or None when it has none."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            fh.seek(max(size - _TRAILER_BYTES, 0))
            tail = fh.read(_TRAILER_BYTES)
    except OSError:
        return None
    if size < _TRAILER_BYTES or not tail.startswith(_TRAILER):
        return None
    return int.from_bytes(tail[len(_TRAILER):], "big"), size - _TRAILER_BYTES


def check(directory: Path, names, recorded: Optional[Dict[str, Tuple[int, int]]] = None) -> Verdict:
    """Verify the files `names` of `directory` that a command is about to read, by its
    manifest; without one, by `recorded` (name -> (bytes, CRC-32): an older step's state.json)
    or a .ckpt's own trailer. Stops at the first damaged file."""
    directory = Path(directory)
    manifest, damaged = read_manifest(directory)
    if damaged:
        return Verdict(damaged)
    if manifest is not None:
        verdict = Verdict(made_by=manifest.get("made_by"), has_manifest=True)
        for name in names:
            entry = manifest["files"].get(name)
            if entry is None:
                if (directory / name).is_file():
                    verdict.unverified.append(name)
                continue
            verdict.problem = _file_problem(directory / name, entry["bytes"], entry["crc32"], MANIFEST)
            if verdict.problem:
                break
        return verdict
    verdict = Verdict()
    for name in names:
        path = directory / name
        if name in (recorded or {}):
            verdict.problem = _file_problem(path, *recorded[name], "state.json")
        elif (own := trailer(path)) is not None:
            verdict.problem = _file_problem(path, own[1] + _TRAILER_BYTES, own[0], "its MindSpore trailer",
                                            length=own[1])
        elif path.is_file():
            verdict.unverified.append(name)
        if verdict.problem:
            break
    return verdict
