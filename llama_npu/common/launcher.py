"""What msrun tells the processes it starts, through their environment: how many workers,
this one's rank, and whether this process is the cluster's scheduler.

A leaf: recipe validation reads the worker count (strategies.parallel.data: auto) before
anything else of the package is imported.
"""
from __future__ import annotations

import os


def launched_workers() -> int:
    """Workers msrun started (MS_WORKER_NUM), or 1 for a plain process."""
    return int(os.environ.get("MS_WORKER_NUM", "1")) if os.environ.get("MS_ROLE") == "MS_WORKER" else 1


def local_workers() -> int:
    """Workers on this node: scripts/launch.sh's LOCAL_WORKERS, else every launched worker."""
    return int(os.environ.get("LOCAL_WORKERS") or launched_workers())


def launched_rank() -> int:
    """This process's rank under msrun (RANK_ID), known before communication starts."""
    return int(os.environ.get("RANK_ID", "0")) if launched_workers() > 1 else 0


def is_scheduler() -> bool:
    """msrun also runs the training command as the cluster's scheduler process."""
    return os.environ.get("MS_ROLE") == "MS_SCHED"
