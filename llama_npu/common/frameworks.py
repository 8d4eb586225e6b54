"""What MindSpore and MindFormers print and where they log: set before they are imported,
and kept off stdout while they are."""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import io
import logging
import os
import sys
from pathlib import Path



def quiet_frameworks(log_dir: Path) -> None:
    """Send MindFormers' file logs into the run directory instead of ./output, and keep
    MindSpore's C++ log to errors. Must run before mindspore/mindformers are imported."""
    os.environ.setdefault("GLOG_v", "3")
    os.environ.setdefault("LOG_MF_PATH", str(Path(log_dir) / "mindformers"))
    os.environ.setdefault("LOCAL_DEFAULT_PATH", str(Path(log_dir) / "mindformers"))


class _Refused(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `package` (importlib.util.find_spec still says it is installed, which is what
    `datasets` records at import) but fails to load it with ModuleNotFoundError, the error an
    optional import catches."""

    def __init__(self, package: str):
        self.package = package

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.package or fullname.startswith(self.package + "."):
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec):
        raise ModuleNotFoundError(f"{spec.name} is not imported here (llama_npu/common/frameworks.py)", name=spec.name)

    def exec_module(self, module):  # never reached: create_module raises
        raise ModuleNotFoundError(module.__name__)


@contextlib.contextmanager
def _not_imported(package: str):
    """Inside the block, importing `package` fails as if it were optional and absent; afterwards it
    imports as usual. (Not by sys.modules[package] = None: scipy's array-API helpers read
    sys.modules['torch'] and fail on None.)"""
    refused = _Refused(package)
    sys.meta_path.insert(0, refused)
    try:
        yield
    finally:
        sys.meta_path.remove(refused)


def mute_mindformers_info() -> None:
    """MindFormers logs every model build at INFO, and import-time warnings about optional
    packages, on stdout, where they would break `--json` output and bury our own lines. Its
    stdout handler is bound while the package is imported, so import it with stdout
    captured (its log files under LOG_MF_PATH keep everything); then raise the level of
    its loggers, whose names embed the log path.

    MindFormers' callbacks import tensorboardX, which imports torch when it is installed (the
    test extra installs it) only to accept torch tensors; no command uses torch, and its import
    alone added ~4.5 s to every command that builds a model, so it is kept out of this one."""
    if "mindformers" not in sys.modules:
        with contextlib.redirect_stdout(io.StringIO()), _not_imported("torch"):
            import mindformers  # noqa: F401  (creates its loggers)

    for name in list(logging.root.manager.loggerDict):
        if name.startswith("mindformers"):
            logging.getLogger(name).setLevel(logging.WARNING)
