"""Whether this host can run the optimizer on the host (strategies.offload.optimizer: host):
its kernel library importable, at the release the offload extra pins, and one tiny fused
update right. training/preflight.py asks it before tokenizing, so a host without the kernel
refuses in one line instead of after the data is tokenized and the model built. numba is
imported only here and in steps/host/kernel.py."""
from __future__ import annotations

import re

import numpy as np

# pyproject.toml's offload extra pins the same (tests/test_install.py checks they agree).
NUMBA_VERSION = "0.68.1"
INSTALL = f"pip install 'numba=={NUMBA_VERSION}' (the offload extra: pip install -e '.[offload]')"


def release(version: str) -> tuple:
    """The release part of a version (0.68.1rc1+local -> (0, 68, 1)); () when it has none."""
    found = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in found.group(0).split(".")) if found else ()


def one_update(adamw) -> None:
    """One tiny fused update, checked against the formula in float64 (a kernel that runs but
    computes something else fails too)."""
    start = np.array([1.0, -2.0, 3.0])
    w, g = start.astype(np.float32), np.array([0.5, 0.25, -1.0], np.float32)
    m, v = np.zeros(3, np.float32), np.zeros(3, np.float32)
    adamw(w, g, m, v, 0.1, 0.9, 0.999, 1e-8, 0.01, 2.0)
    grad = 2.0 * g.astype(np.float64)
    want = start - 0.1 * (0.1 * grad / (np.sqrt(0.001 * grad ** 2) + 1e-8) + 0.01 * start)
    if not np.allclose(w, want, rtol=1e-5, atol=0):
        raise ArithmeticError(f"one fused AdamW update gave {w.tolist()} where the formula gives {want.tolist()}")


def kernel_problem() -> str:
    """"" when the host's AdamW kernel imports, is numba NUMBA_VERSION and updates right,
    else what is wrong (one clause)."""
    try:
        import numba
    except Exception as exc:  # noqa: BLE001 -- a broken install raises anything on import
        return f"numba does not import ({type(exc).__name__}: {exc})".replace("\n", " ")
    found = getattr(numba, "__version__", "unknown")
    if release(found) != release(NUMBA_VERSION):  # before the kernels' import, which another release may break
        return f"numba is {found}, not {NUMBA_VERSION}"
    try:
        from . import kernel as host_kernel

        one_update(host_kernel.adamw)
    except Exception as exc:  # noqa: BLE001 -- a compile or run failure of the kernel, whatever its kind
        return f"its fused AdamW kernel fails on this host ({type(exc).__name__}: {exc})".replace("\n", " ")
    return ""
