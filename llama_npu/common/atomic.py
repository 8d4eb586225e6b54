"""Outputs that appear only when complete: checkpoints, prepared datasets, converted and
quantized weights go through `staged_directory`; single files rewritten in place (a
resumed run's metrics, profile reports) through `replace_file`."""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Optional


class UnwritableError(RuntimeError):
    """A destination that cannot be created: bad input, found before any work is done."""


def unwritable_reason(path: Path) -> Optional[str]:
    """Why `path` could not be created or written, without creating it."""
    existing = Path(path)
    if existing.is_file():  # a file to be replaced (--overwrite): what matters is its directory
        existing = existing.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a directory"
    try:  # an unnamed temporary file: nothing is left even if we die here
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        return f"cannot create files in {existing} ({exc.strerror})"
    return None


def check_writable(path: Path, option: str) -> None:
    """Refuse a destination (`--dst`, `--output`) that cannot be written, before the command
    reads or converts anything: otherwise the error comes as a traceback at the end."""
    reason = unwritable_reason(path)
    if reason:
        raise UnwritableError(f"{option} {path} is not writable: {reason}")


@contextmanager
def staged_directory(dst: Path, replace: bool = False):
    """Yield an empty hidden sibling of `dst` to write into. When the block succeeds it is
    renamed to `dst` (an existing `dst` is swapped out only with `replace`, and removed only
    once the new one is in place); when it fails it is deleted. A crash leaves at most a
    hidden `.NAME.partial-PID` directory, never a half-written `dst`."""
    dst = Path(dst)
    staging = dst.parent / f".{dst.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
        apply_umask(staging)
        if dst.exists():
            if not replace:
                raise FileExistsError(f"{dst} exists")
            retired = dst.parent / f".{dst.name}.old-{os.getpid()}"
            os.rename(dst, retired)
            os.rename(staging, dst)
            shutil.rmtree(retired)
        else:
            os.rename(staging, dst)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def replace_file(path: Path, write) -> None:
    """Call `write(tmp)` for a hidden sibling of `path`, then rename it over `path`: a
    reader sees the old file or the new one, never half of one. A write that fails (a full
    disk, Ctrl-C) leaves `path` as it was and no hidden half-written sibling."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def current_umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it: put it straight back
    os.umask(mask)
    return mask


def apply_umask(root: Path) -> None:
    """Give `root` and everything under it the modes the user's umask gives new files.
    MindSpore chmods what it writes to owner-only (checkpoints 0400, MindRecord 0600),
    which on a shared host hides a run's outputs from everyone else."""
    mask = current_umask()
    root = Path(root)
    paths = [root, *root.rglob("*")] if root.is_dir() else [root]
    for path in paths:
        if path.is_symlink():
            continue
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)
