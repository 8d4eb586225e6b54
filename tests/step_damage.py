"""A checkpoint step damaged the ways disks, copies and interrupted syncs damage one (#59):
bytes flipped, a file cut, extended, deleted, swapped with another step's, its JSON edited
(with checksums.json resealed over the edit, or not), a file replaced by a link to /dev/zero,
an entry dropped from checksums.json. Each returns whether a reader must refuse the step
(or pass it over in a run directory): every damage but an edit resealed into a valid
config.json changes bytes some checksum records. tests/test_verified_reads.py damages one
way each; scripts/fuzz.py --kind readers at random, then runs every reader on the step.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

MANIFEST = "checksums.json"
FILES = ("model.ckpt", "optimizer.ckpt", "state.json", "config.json", MANIFEST)
# Values no sidecar number may hold; json.dumps writes the floats as Infinity / NaN.
BAD_NUMBERS = [float("inf"), float("-inf"), float("nan"), -1, 2 ** 64, 1.5, "6", None, True, [], {}]


def flip(path: Path, at: int = None) -> None:
    """One bit changed, the size kept: only a checksum notices."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if at is None else at] ^= 0x01
    path.write_bytes(bytes(data))


def reseal(step: Path, record: dict) -> None:
    """checksums.json rewritten from `record` (its files' entries as given, not recomputed),
    sealed so that it passes its own check: a manifest made to agree with a lie."""
    from llama_npu.common.checksums import _sealed

    record = {k: v for k, v in record.items() if k != "crc32"}
    (step / MANIFEST).write_text(json.dumps(dict(record, crc32=_sealed(record)), indent=2), encoding="utf-8")


def manifest(step: Path) -> dict:
    return json.loads((step / MANIFEST).read_text(encoding="utf-8"))


def unlisted_and_flipped(step: Path, name: str = "model.ckpt") -> bool:
    """`name`'s entry dropped from checksums.json, resealed, then a byte of it flipped."""
    record = manifest(step)
    del record["files"][name]
    reseal(step, record)
    flip(step / name)
    return True


def linked_to_dev_zero(step: Path, name: str = "state.json") -> bool:
    (step / name).unlink()
    (step / name).symlink_to("/dev/zero")
    return True


def sidecar_number(step: Path, key: str, value, sealed: bool = True) -> bool:
    """state.json's `key` (a dotted path: files.optimizer.ckpt splits at the first dot only)
    set to `value`, with checksums.json resealed over the edit when `sealed`."""
    state = json.loads((step / "state.json").read_text(encoding="utf-8"))
    head, _, tail = key.partition(".")
    if tail:
        state.setdefault(head, {})[tail] = value
    else:
        state[head] = value
    (step / "state.json").write_text(json.dumps(state), encoding="utf-8")
    if sealed:
        from llama_npu.common.checksums import file_crc32

        record = manifest(step)
        record["files"]["state.json"] = {"bytes": (step / "state.json").stat().st_size,
                                         "crc32": file_crc32(step / "state.json")}
        reseal(step, record)
    return True


def listed_and_missing(step: Path, name: str = "config.json") -> bool:
    (step / name).unlink()
    return True


# ---------------------------------------------------------------- at random, for scripts/fuzz.py

def _cut(path: Path, rng: random.Random) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(rng.randrange(path.stat().st_size or 1))


def _extend(path: Path, rng: random.Random) -> None:
    with open(path, "ab") as fh:
        fh.write(bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))))


def _edit_json(step: Path, name: str, rng: random.Random) -> bool:
    """A number of `name`'s JSON set to a value no reader may take; resealed or not."""
    data = json.loads((step / name).read_text(encoding="utf-8"))
    paths = list(_number_paths(data))
    if not paths:
        return False
    *parents, leaf = rng.choice(paths)
    node = data
    for key in parents:
        node = node[key]
    node[leaf] = rng.choice(BAD_NUMBERS)
    (step / name).write_text(json.dumps(data), encoding="utf-8")
    if name != MANIFEST and rng.random() < 0.5:
        from llama_npu.common.checksums import file_crc32

        record = manifest(step)
        record["files"][name] = {"bytes": (step / name).stat().st_size, "crc32": file_crc32(step / name)}
        reseal(step, record)
        return name != "config.json"  # a resealed config.json edit is checked by its reader's own checks only
    return True


def _number_paths(node, prefix=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _number_paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _number_paths(value, (*prefix, i))
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield prefix


def damage_at_random(step: Path, other: Path, rng: random.Random) -> tuple[str, bool]:
    """(what was done, whether a reader must refuse the step): one damage of `step`, drawn
    from every way above; `other` is another step of the same run (for a swap)."""
    name = rng.choice(FILES)
    path = step / name
    how = rng.choice(["flip", "cut", "extend", "delete", "swap", "json", "link", "unlist", "unlist"])
    before = {n: (step / n).read_bytes() for n in FILES if (step / n).is_file()}
    if how == "json" and name.endswith(".json"):
        refuse = _edit_json(step, name, rng)
    elif how == "unlist" and name != MANIFEST:
        record = manifest(step)
        record["files"].pop(name, None)
        reseal(step, record)
        refuse = True  # an unlisted file is damage, even with its bytes intact
        if rng.random() < 0.7:
            flip(path, rng.randrange(path.stat().st_size))
    elif how == "link":
        refuse = linked_to_dev_zero(step, name)
    elif how == "delete":
        path.unlink()
        refuse = name != MANIFEST  # none at all: read as written before it existed, by state.json's CRC-32s
    elif how == "swap":
        shutil.copyfile(other / name, path)
        refuse = path.read_bytes() != before[name]
    elif how == "cut":
        _cut(path, rng)
        refuse = True
    elif how == "extend":
        _extend(path, rng)
        refuse = True
    else:
        flip(path, rng.randrange(path.stat().st_size))
        how, refuse = "flip", True
    return f"{how} {name}", refuse


def copy_run(run: Path, dst: Path) -> Path:
    """A run directory copied to damage (never the shared one)."""
    shutil.copytree(run, dst, symlinks=True)
    os.utime(dst)
    return dst
