"""A run's checkpoint policy: which step it resumes (the same on every rank), what it saves
(what each rank owns), what it keeps (the newest complete ones of the branch that runs),
and the meeting point that keeps one rank from ending while another still writes.

The files themselves are checkpoints/files.py's. Rank agreement is read from the run directory, so
it needs no collective while a rank may be dead, and then checked with one all-reduce over
the live ranks (a rank whose disk shows another step ends the launch with one line).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from ..common.collective import all_reduce_sum
from ..common.console import note, warn
from .contract import Checkpointed
from .files import (CheckpointError, checkpoint_root, inspect, optimizer_state_params, owned, prune,
                    remove_abandoned_saves, save_checkpoint, set_aside, step_of)


def _gathered(world, value: float) -> list:
    """Every rank's `value`, on every rank: the sum of one-hot rows (exact for integers below
    2**24). Also a barrier."""
    row = np.zeros(world.size, np.float32)
    row[world.rank] = value
    return [int(v) for v in all_reduce_sum(row)]


class Checkpointer:
    """Saving, pruning, the resume choice and rank agreement of one run (one process)."""

    def __init__(self, run_dir: Path, world, keep_last: int, model_description: Optional[dict] = None):
        self.run_dir = Path(run_dir)
        self.world = world
        self.keep_last = keep_last
        self.model_description = model_description
        self.root = checkpoint_root(self.run_dir, world)
        self.last: Optional[Path] = None  # the newest complete checkpoint this process knows of

    @property
    def saves(self) -> bool:
        """Unsharded ranks hold the same weights: rank 0 saves them. Sharded, each its shard."""
        return self.world.is_main or self.world.sharded

    def roots(self) -> list:
        """Every rank's step directories: one root unsharded, rank_<R> for each R sharded."""
        if not self.world.sharded:
            return [self.root]
        return [self.run_dir / "checkpoints" / f"rank_{rank}" for rank in range(self.world.size)]

    def _copies(self, path: Path) -> list:
        """Every rank's copy of the checkpoint `path`: itself, or rank_<R>/step_<N> for each R."""
        if not self.world.sharded:
            return [path]
        return [path.parent.parent / f"rank_{rank}" / path.name for rank in range(self.world.size)]

    # ------------------------------------------------------------ resume

    def choose(self, candidates: list) -> Optional[Path]:
        """This rank's copy of the newest candidate step that is complete on every rank, each
        file read against its CRC; warns about each step skipped. `candidates` are step
        directories newest first (preflight.resume_candidates); a single one is --resume PATH
        and must itself be good."""
        for path in candidates:
            copies = self._copies(path)
            reasons = [reason for copy in copies if (reason := inspect(copy, verify=True)[1])]
            if not reasons:
                return copies[self.world.rank] if self.world.sharded else path
            if len(candidates) == 1:
                raise CheckpointError(f"--resume {path}: {reasons[0]}")
            warn(f"skipping checkpoint {path}: {reasons[0]}")
        if candidates:
            raise CheckpointError(f"resume: no checkpoint among {', '.join(p.name for p in candidates)} under "
                                  f"{candidates[0].parent} is complete on every rank (see the warnings above)")
        return None

    def agree(self, step: int) -> None:
        """Every live rank chose the same step (0: none), or the run ends here with one line."""
        if self.world.size == 1:
            return
        chosen = _gathered(self.world, step)
        if len(set(chosen)) > 1:
            found = ", ".join(f"rank {rank}: step {step}" for rank, step in enumerate(chosen))
            raise CheckpointError(f"resume: the ranks found different newest complete steps ({found}); every "
                                  f"rank must see the same {self.run_dir / 'checkpoints'}")

    def load(self, path: Path, step: Checkpointed) -> dict:
        """Load `path` into the run's step (its own way, checkpoints/contract.py); its state.json."""
        note(f"loading checkpoint {path}")
        if not step.states_in_ranges:
            state = step.load_from(path)
        else:
            # Every rank reads the whole files to keep its range, so the ranks read one at a
            # time and a node's host holds one checkpoint at a time, not one a rank.
            for turn in range(self.world.size):
                if turn == self.world.rank:
                    state = step.load_from(path)
                _gathered(self.world, 1)
        step.after_load()
        self.last = path
        return state

    def start_branch(self, step: int) -> None:
        """Checkpoints later than the step this run starts from belong to an abandoned branch:
        set them aside (rank 0, for every rank) before this run saves, so that pruning never
        drops what this run wrote and --resume auto continues this run, not that branch.
        preflight.check_rewind refused the run already if they could not be moved."""
        if not self.world.is_main:
            return
        for root in self.roots():
            moved = set_aside(root, step)
            if moved is not None:
                note(f"resume: moved {', '.join(p.name for p in sorted(moved.iterdir(), key=step_of))} "
                     f"(later than step_{step}, another branch) aside to {moved}")

    # ------------------------------------------------------------ save

    def save(self, step: int, params, optimizer, state: dict) -> Path:
        """Write this rank's checkpoint of `step`, then prune its root (and what killed saves left)."""
        model = owned(params)
        opt = owned(optimizer_state_params(optimizer, params))
        # config.json's dtype is the written weights' (the host step's fp32 masters, not the card's copies)
        described = self.model_description and {**self.model_description, "dtype": str(params[0].dtype).lower()}
        path = save_checkpoint(self.root, step, model, opt, state, described)
        self.last = path
        prune(self.root, self.keep_last)
        remove_abandoned_saves(self.root)
        return path

    def wait_for_every_rank(self) -> None:
        """Return once every rank got here: a rank must not exit while another still writes
        its checkpoint, because msrun SIGKILLs every worker once one has exited non-zero."""
        if self.world.size > 1:
            _gathered(self.world, 1)
