"""Checksums of the directories llama-npu writes, checked before a command uses a byte of them.

Every directory a later command reads -- a checkpoint step (checkpoints/files.py), a
converted one (convert hf-to-ms, and ms-to-hf's export), a quantized one, a merged one and
a prepared dataset (prepare-data) -- gets `checksums.json`, written last into its staging
directory: each file's byte size and CRC-32, the command that made it, and a CRC-32 of that
record itself, so that a flipped byte in any file, the manifest included, is found and named.

A directory with a manifest must list every file a command reads of it: one it does not
list, or one it lists that is gone, is damage like a flipped byte. A .ckpt's own CRC-32
(b"crc_num" and 10 big-endian bytes over everything before them, which MindSpore appends:
_exec_save and _parse_ckpt_proto in mindspore/train/serialization.py) is checked in the
same pass as the manifest's, and a step's state.json CRC-32s must agree with the manifest's.
Directories with no manifest at all (written before it existed) are still read: a step's
files by the sizes and CRC-32 its state.json recorded, a .ckpt by its own CRC-32; what
neither covers is named in a warning and read unverified.

Sidecars (checksums.json, state.json, config.json) are read by `read_sidecar`: a regular
file of at most SIDECAR_BYTES, so a link to /dev/zero or a FIFO is damage, not a read that
never ends.

The CRC-32 pass costs about a quarter of mindspore.load_checkpoint's read of the same file
(benchmarks/verified_reads.py printed 0.26; docs/checkpoints-and-resume.md). A leaf module: zlib and json.
"""
from __future__ import annotations

import json
import os
import stat
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

MANIFEST = "checksums.json"
_FORMAT = "llama-npu checksums 1"
_TRAILER = b"crc_num"  # MindSpore's .ckpt CRC trailer: this tag, then a 10-byte big-endian CRC-32
_TRAILER_BYTES = len(_TRAILER) + 10
SIDECAR_BYTES = 1 << 20  # a sidecar is a few hundred bytes; a Hugging Face config.json a few kB
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


def read_sidecar(path: Path, limit: int = SIDECAR_BYTES) -> str:
    """The UTF-8 text of the small file `path`. Raises OSError when it is missing or not a
    regular file (a link to /dev/zero, a FIFO: opened without blocking, never read) and
    ValueError when it holds more than `limit` bytes or is not UTF-8, so that no sidecar makes
    a reader's memory grow with its size or wait on a pipe."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"more than {limit:,} bytes, far more than such a file holds")
    return data.decode("utf-8")


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
    if not os.path.lexists(path):
        return None, None
    try:
        text = read_sidecar(path)
    except (OSError, ValueError) as exc:
        return None, f"{path} is damaged or unreadable ({getattr(exc, 'strerror', None) or exc})"
    try:
        record = json.loads(text)
        sealed = record.pop("crc32")
        ok = record["format"] == _FORMAT and sealed == _sealed(record) and _one_line(record["made_by"]) and all(
            _plain_name(name) and _count(e["bytes"]) and _count(e["crc32"]) for name, e in record["files"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        ok = False
    if not ok:
        return None, f"{path} is damaged (it no longer matches the CRC-32 it was sealed with)"
    return record, None


def _count(value) -> bool:
    """A byte count or a CRC-32 as JSON holds one: a whole number from 0 (never a bool, NaN
    or infinity, which int() turns into a traceback or a lie)."""
    return type(value) is int and value >= 0


def _plain_name(name: str) -> bool:
    """A file of the directory itself: a manifest names no path elsewhere (/dev/zero, ../x)."""
    return bool(name) and "/" not in name and "\0" not in name and name not in (".", "..")


def _one_line(text) -> bool:
    return isinstance(text, str) and len(text.splitlines()) <= 1


def listed(directory: Path) -> List[str]:
    """The files an intact manifest of `directory` covers; none when it has none (or a
    damaged one, which check() reports)."""
    manifest, _ = read_manifest(directory)
    return sorted(manifest["files"]) if manifest else []


def trailer(path: Path) -> Optional[Tuple[int, int]]:
    """(CRC-32, bytes it covers) of a .ckpt's MindSpore trailer, or None when it has none."""
    if not path.is_file():  # a FIFO would block the open
        return None
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


def _absent(path: Path, whose: str) -> str:
    what = "is not a regular file" if os.path.lexists(path) else "is missing"
    return f"{path} {what} ({whose} lists it)"


def _file_problem(path: Path, size: Optional[int], crc: Optional[int], whose: str) -> Optional[str]:
    """Why `path` is not the file of `size` bytes and CRC-32 `crc` that `whose` recorded (None:
    no record, its MindSpore trailer alone covers it), its own trailer included; None: sound."""
    if not path.is_file():
        return _absent(path, whose)
    stat_ = path.stat()
    if size is not None and stat_.st_size != size:
        return f"{path} has {stat_.st_size:,} bytes, {whose} recorded {size:,} (cut short or overwritten)"
    key = (str(path.resolve()), stat_.st_size, stat_.st_mtime_ns, crc)
    if key in _SOUND:
        return None
    own = trailer(path)
    try:
        whole = file_crc32(path, own[1] if own else None)
        covered, whole = (whole, zlib.crc32(_TRAILER + own[0].to_bytes(10, "big"), whole)) if own else (None, whole)
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror})"
    if crc is not None and whole != crc:
        return f"{path} is damaged or unreadable (its CRC-32 differs from the one {whose} recorded)"
    if own is not None and covered != own[0]:
        return f"{path} is damaged or unreadable (its CRC-32 differs from the one its MindSpore trailer recorded)"
    _SOUND.add(key)
    return None


def _listing_problem(directory: Path, manifest: dict, names, recorded: Dict[str, Tuple[int, int]]) -> Optional[str]:
    """What a manifest and the directory disagree on, without reading a byte of the files:
    a file read that it does not list, one it lists that is gone or of another size, or a
    checksum state.json recorded otherwise."""
    for name in names:
        entry, path = manifest["files"].get(name), directory / name
        if entry is None and not os.path.lexists(path):
            continue  # neither here nor listed: what the reader makes of its absence (a LoRA step has no config.json)
        if entry is None:
            return (f"{path} is not listed in {MANIFEST} (a directory with one lists every file it holds: this "
                    f"file was added or its entry removed since)")
        if not path.is_file():
            return _absent(path, MANIFEST)
        if path.stat().st_size != entry["bytes"]:
            return (f"{path} has {path.stat().st_size:,} bytes, {MANIFEST} recorded {entry['bytes']:,} (cut short "
                    f"or overwritten)")
        if name in recorded and tuple(recorded[name]) != (entry["bytes"], entry["crc32"]):
            return (f"{path}: {MANIFEST} and state.json record different checksums for it (one of them was "
                    f"rewritten since the save)")
    return None


def check(directory: Path, names, recorded: Optional[Dict[str, Tuple[int, int]]] = None,
          read: bool = True) -> Verdict:
    """Verify the files `names` of `directory` that a command is about to read, by its
    manifest, which must list each of them (and agree with `recorded`: name -> (bytes,
    CRC-32), a step's state.json); without one, by `recorded` or a .ckpt's own trailer.
    A .ckpt's trailer is checked in either case. `read=False` checks only what needs no
    read of the files (listing, sizes). Stops at the first damaged file."""
    directory, recorded = Path(directory), recorded or {}
    names = [name for name in names if name != MANIFEST]  # its own seal covers it
    manifest, damaged = read_manifest(directory)
    if damaged:
        return Verdict(damaged)
    if manifest is not None:
        verdict = Verdict(made_by=manifest.get("made_by"), has_manifest=True)
        verdict.problem = _listing_problem(directory, manifest, names, recorded)
        for name in names if read and not verdict.problem else ():
            entry = manifest["files"].get(name)
            if entry is None:
                continue
            verdict.problem = _file_problem(directory / name, entry["bytes"], entry["crc32"], MANIFEST)
            if verdict.problem:
                break
        return verdict
    verdict = Verdict()
    for name in names if read else ():  # unread, sizes are all a step's state.json records (files.inspect)
        path = directory / name
        size, crc = recorded.get(name, (None, None))
        if size is not None or trailer(path) is not None:
            verdict.problem = _file_problem(path, size, crc, "state.json")
        elif path.is_file():
            verdict.unverified.append(name)
        if verdict.problem:
            break
    return verdict

