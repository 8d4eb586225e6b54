"""Checkpoint files: atomic save, completeness (sizes and CRC), keep-last-K, set-aside, load.
The policy -- which step to resume, when to prune, what the ranks agree on -- is
checkpoints/policy.py's.

Layout of `<run>/checkpoints/step_<N>/` (`checkpoints/rank_<R>/step_<N>/` per rank when
parameters are sharded):
  model.ckpt       trained weights, loadable with mindspore.load_checkpoint
  optimizer.ckpt   optimizer state (moments, step counter, learning rate)
  state.json       the sidecar: step, samples consumed, RNG, loss scale, recipe hash and the
                   byte size and CRC-32 of each file above; its presence (with sizes that
                   match) is what makes a checkpoint complete.
  checksums.json   size and CRC-32 of every file above, state.json and config.json included
                   (common/checksums.py); every command checks the files it reads by it.
A checkpoint is written under a temporary name and renamed into place, so a crash while
saving leaves the previous checkpoints untouched. Both .ckpt files also carry MindSpore's own
CRC (crc_check), checked again when they are loaded.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Optional

from ..common.atomic import staged_directory
from ..common.console import warn
from ..common.checksums import MANIFEST, Verdict, check, file_crc32, listed, read_sidecar, write_manifest

WEIGHTS = "model.ckpt"
OPTIMIZER = "optimizer.ckpt"
SIDECAR = "state.json"
CONFIG = "config.json"
# What the readers read of a step: eval, generate and ms-to-hf the weights and config.json,
# train --resume the weights, optimizer.ckpt and state.json.
STEP_FILES = (WEIGHTS, OPTIMIZER, SIDECAR, CONFIG)
SET_ASIDE = "set_aside"  # <root>/set_aside/after_step_<N>[_<k>]/step_<M>: an abandoned branch
_STEP_DIR = re.compile(r"^step_(\d+)$")
_ABANDONED_SAVE = re.compile(r"^\.step_\d+\.partial-(\d+)$")  # atomic.staged_directory's staging name


class CheckpointError(RuntimeError):
    pass


def checkpoint_root(run_dir: Path, world=None) -> Path:
    """Where step_<N> directories live: <run>/checkpoints, or <run>/checkpoints/rank_<R>
    when parameters are sharded across ranks (semi-auto parallel), one shard per rank."""
    root = Path(run_dir) / "checkpoints"
    return root / f"rank_{world.rank}" if world is not None and world.sharded else root


def rank_roots(run_dir: Path) -> list:
    """The rank_<R> roots of a sharded run, by rank; [] for a run that saves whole weights."""
    root = Path(run_dir) / "checkpoints"
    found = sorted((int(m.group(1)), p) for p in root.glob("rank_*") if (m := re.fullmatch(r"rank_(\d+)", p.name)))
    return [p for _, p in found]


def step_of(path: Path) -> int:
    match = _STEP_DIR.match(Path(path).name)
    if match is None:
        raise CheckpointError(f"{path}: not a step_<N> checkpoint directory")
    return int(match.group(1))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _named(params) -> list:
    return [{"name": p.name, "data": p} for p in params]


class _ParameterView:
    """A parameter list seen as MindSpore's cell save sees a Cell: by parameters_and_names()."""

    def __init__(self, params):
        self._params = list(params)

    def parameters_and_names(self):
        return ((p.name, p) for p in self._params)


def owned(params) -> list:
    """The parameters this rank saves: exactly those MindSpore's own Cell save keeps, by its own
    functions (mindspore/train/serialization.py, _is_auto_parallel_mode and
    _convert_cell_param_and_names_to_dict, lines 857-936 in 2.9.0). It always skips a pipeline's
    shared copies (param_info.is_pipeline_shared_param); in GRAPH_MODE, when the compile set
    any parameter up for a parallel layout (param_info.is_param_init), it also skips what this
    rank's graph does not hold (`not sliced`: another pipeline stage's copy) and what was never
    initialised (`has_init`). `sliced` alone is no test of ownership: _slice_parameter
    (mindspore/parallel/_utils.py) marks every parameter it is called on. Unsharded runs set
    no is_param_init, so every parameter but a pipeline-shared one is kept. The gate is read off
    the list given, not the whole train cell: the weights, or the optimizer's state, whose step
    counter the compile sets up like any other parameter of the rank's graph."""
    from mindspore.train.serialization import (  # imported here: --help imports this module
        _convert_cell_param_and_names_to_dict, _is_auto_parallel_mode)

    view = _ParameterView(params)
    return list(_convert_cell_param_and_names_to_dict(view, None, _is_auto_parallel_mode(view)).values())


def optimizer_state_params(optimizer, model_params) -> list:
    """The optimizer's own Parameters (moments, step, lr), not the model weights it holds."""
    model_ids = {id(p) for p in model_params}
    return [p for p in optimizer.get_parameters() if id(p) not in model_ids]


def save_checkpoint(root: Path, step: int, model_params, optimizer_params, state: dict,
                    model_description: Optional[dict] = None) -> Path:
    """Write <root>/step_<step> atomically. With a `model_description` (full fine-tunes) the
    step directory also gets the config.json of a converted checkpoint, so eval, generate,
    quantize and ms-to-hf take it directly."""
    import mindspore as ms  # imported here: --help imports this module; MindSpore, only to save or load

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    # replace=True: re-saving a step after a resume swaps it, never leaving a gap.
    with staged_directory(final, replace=True) as partial:
        ms.save_checkpoint(_named(model_params), str(partial / WEIGHTS), crc_check=True)
        ms.save_checkpoint(_named(optimizer_params), str(partial / OPTIMIZER), crc_check=True)
        if model_description is not None:
            (partial / CONFIG).write_text(json.dumps(model_description, indent=2), encoding="utf-8")
        for name in (WEIGHTS, OPTIMIZER):
            with open(partial / name, "rb") as fh:
                os.fsync(fh.fileno())
        names = (WEIGHTS, OPTIMIZER)
        crcs = {name: file_crc32(partial / name) for name in names}
        state = dict(state, step=step, files={name: (partial / name).stat().st_size for name in names}, crc32=crcs)
        with open(partial / SIDECAR, "w", encoding="utf-8") as fh:
            json.dump(state, fh, indent=2)
            fh.flush()
            os.fsync(fh.fileno())
        write_manifest(partial, f"llama-npu train (step {step})", crcs)
    _fsync_dir(root)
    return final


def inspect(path: Path, verify: bool = False) -> tuple[Optional[dict], Optional[str]]:
    """(sidecar, None) for a complete checkpoint, else (None, why it is not): a sidecar
    whose every value is what a resume can use, files of the sizes it records, and, with a
    checksums.json, every file a reader reads listed there and every file listed there
    present. `verify` also reads every such file against its CRC-32s (checksums.json's,
    state.json's, MindSpore's own trailer)."""
    path = Path(path)
    state, unreadable = _sidecar(path)
    if unreadable:
        return None, unreadable
    wrong = _sidecar_problem(path, state)
    if wrong:  # a damaged sidecar is named as such, with what to do, when checksums.json knows it
        verdict = _verdict(path, [SIDECAR])
        if verdict.problem:
            return None, f"{verdict.problem}; {_remedy(path, verdict)}"
        return None, f"sidecar {SIDECAR}: {wrong}"
    for name, size in state.get("files", {}).items():
        actual = (path / name).stat().st_size if (path / name).is_file() else -1
        if actual != size:
            return None, f"{name} has {actual} bytes, expected {size}"
    names = [name for name in STEP_FILES if os.path.lexists(path / name)]
    problem_found = check(path, sorted({*names, *listed(path)}), recorded_checksums(state), read=verify).problem
    if problem_found:
        return None, problem_found
    return state, None


def _sidecar(path: Path) -> tuple[Optional[dict], Optional[str]]:
    """(the step's state.json object, None), or (None, why it cannot be read): read within
    a bound, and only as a regular file (a link to /dev/zero is not read for ever)."""
    try:
        state = json.loads(read_sidecar(path / SIDECAR))
    except (OSError, ValueError, RecursionError) as exc:
        return None, f"sidecar {SIDECAR} unreadable ({exc})"
    if not isinstance(state, dict):
        return None, f"sidecar {SIDECAR} unreadable (a JSON {type(state).__name__}, expected an object)"
    return state, None


def _count(value) -> bool:
    """A whole number from 0, as a step, a size or a count must be (not a bool, NaN or infinity)."""
    return type(value) is int and value >= 0


def _counts(value) -> bool:
    """A JSON object of file name -> whole number (sizes, CRC-32s)."""
    return isinstance(value, dict) and all(_count(v) for v in value.values())


def _sidecar_problem(path: Path, state: dict) -> Optional[str]:
    """What a resume or a reader would read wrongly from the sidecar's values (the step it
    continues at, the samples to skip, the loss scale, the data order, the files' sizes and
    CRC-32s), or None."""
    step = state.get("step")
    named = _STEP_DIR.match(path.name)
    if not _count(step) or (named and step != int(named.group(1))):
        return f"step is {step!r}, expected {named.group(1) if named else 'a whole number'}"
    for key, what in (("files", "its byte count"), ("crc32", "CRC-32")):
        if not _counts(state.get(key, {})):
            return f"{key} is {state[key]!r}, expected file name -> {what}"
    if "samples_consumed" in state and not _count(state["samples_consumed"]):  # a shard or selftest step has none
        return f"samples_consumed is {state.get('samples_consumed')!r}, expected a whole number"
    rng = state.get("rng", {"seed": 0, "data_epoch": 0})  # a selftest's shards save none
    if not (isinstance(rng, dict) and type(rng.get("seed")) is int and _count(rng.get("data_epoch"))):
        return f"rng is {rng!r}, expected {{seed: a whole number, data_epoch: a whole number from 0}}"
    scale = state.get("loss_scale", {"scale": 1.0, "clean_steps": 0})
    if not (isinstance(scale, dict) and isinstance(scale.get("scale"), (int, float)) and not isinstance(
            scale["scale"], bool) and 0 < scale["scale"] < float("inf") and _count(scale.get("clean_steps"))):
        return f"loss_scale is {scale!r}, expected {{scale: a number above 0, clean_steps: a whole number}}"
    return None


def recorded_checksums(state: dict) -> dict:
    """name -> (bytes, CRC-32) of the .ckpt files a sidecar recorded (what covers a step
    written before checksums.json)."""
    crcs = state.get("crc32") if isinstance(state.get("crc32"), dict) else {}
    sizes = state.get("files") if isinstance(state.get("files"), dict) else {}
    return {name: (sizes[name], crc) for name, crc in crcs.items()
            if name in sizes and type(sizes[name]) is int and type(crc) is int}  # inspect refuses any other


def _verdict(directory: Path, names) -> Verdict:
    try:
        state = json.loads(read_sidecar(directory / SIDECAR)) if os.path.lexists(directory / SIDECAR) else {}
        recorded = recorded_checksums(state) if isinstance(state, dict) else {}
    except (OSError, ValueError, RecursionError):
        recorded = {}  # a damaged sidecar: the manifest names it, or it stays unverified
    return check(directory, names, recorded)


def _read_together(paths) -> dict:
    """directory -> the names to check when `paths` are read: a directory is checked whole,
    every file its manifest lists (a damaged optimizer.ckpt means the save that wrote the
    step went wrong, even where only model.ckpt is read), a sidecar always, and a step's
    every file any reader reads, which its manifest must list."""
    by_dir: dict = {}
    for path in map(Path, paths):
        by_dir.setdefault(path.parent, []).append(path.name)
    for directory, names in by_dir.items():
        whole = STEP_FILES if _STEP_DIR.match(directory.name) else (SIDECAR,)
        present = [n for n in whole if os.path.lexists(directory / n)]
        names.extend(n for n in dict.fromkeys([*listed(directory), *present]) if n not in names)
    return by_dir


def damage(paths) -> Optional[str]:
    """The first of `paths` that is damaged (one clause naming the file), or None."""
    for directory, names in _read_together(paths).items():
        found = _verdict(directory, names).problem
        if found:
            return found
    return None


def _remedy(directory: Path, verdict: Verdict) -> str:
    if _STEP_DIR.match(directory.name) and (directory / SIDECAR).exists():
        older = [p for p in _step_dirs(directory.parent) if step_of(p) < step_of(directory) and problem(p) is None]
        return (f"use an older step, such as {older[-1]}" if older
                else "no older step is complete: train again from the start")
    if verdict.made_by:
        return f"write it again: {verdict.made_by}"
    return "write it again from its source (convert hf-to-ms, quantize or merge-checkpoints, whichever made it)"


_WARNED: set = set()


def warn_once(message: str) -> None:
    """A warning a command would otherwise repeat (eval resolves its checkpoint twice)."""
    if message not in _WARNED:
        _WARNED.add(message)
        warn(message)


def verify_read(paths) -> None:
    """Before a command reads `paths` (files of checkpoints, converted or quantized
    directories): raise CheckpointError, one line naming the first damaged file and what to
    do; warn once about the files no checksum covers (a directory of an older llama-npu)."""
    for directory, names in _read_together(paths).items():
        verdict = _verdict(directory, names)
        if verdict.problem:
            raise CheckpointError(f"{verdict.problem}; {_remedy(directory, verdict)}")
        if verdict.unverified:
            warn_once(f"{directory}: {', '.join(verdict.unverified)} read unverified: no checksum covers "
                 f"{'them' if len(verdict.unverified) > 1 else 'it'} (written by a llama-npu older than {MANIFEST}; "
                 f"write the directory again to have it verified)")


def problem(path: Path) -> Optional[str]:
    """Why `path` is not a complete checkpoint, or None when it is."""
    return inspect(path)[1]


def read_state(path: Path) -> Optional[dict]:
    """The sidecar of a complete checkpoint, or None (with the reason as a warning)."""
    state, reason = inspect(path)
    if reason is not None:
        warn(f"skipping checkpoint {path}: {reason}")
    return state


def _step_dirs(root: Path):
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


def step_dirs_newest_first(root: Path) -> list:
    return list(reversed(_step_dirs(Path(root))))


def prune(root: Path, keep_last: int) -> list:
    """Delete all but the newest `keep_last` complete checkpoints under `root`; return what
    was deleted. Incomplete ones are neither counted nor deleted (a damaged file is evidence,
    and an incomplete newest step must never push out a complete one)."""
    complete = [p for p in _step_dirs(Path(root)) if problem(p) is None]
    doomed = complete[:-keep_last] if keep_last > 0 else []
    for path in doomed:
        shutil.rmtree(path)
    return doomed


def process_alive(pid: int) -> bool:
    """Whether a process with this PID lives on this host (a PID of another host tells nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return True


def remove_abandoned_saves(root: Path) -> list:
    """Delete the hidden `.step_N.partial-PID` directories under `root` whose process is gone:
    a save cut off by SIGKILL or a second signal leaves one (staged_directory cannot clean up
    after a kill), and nothing else would ever remove it. Only this rank's processes write
    into `root`, so a PID that is neither this process nor alive marks an abandoned save."""
    root = Path(root)
    if not root.is_dir():
        return []
    doomed = [p for p in root.iterdir()
              if (m := _ABANDONED_SAVE.match(p.name)) and int(m.group(1)) != os.getpid() and not process_alive(int(m.group(1)))]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def later_steps(root: Path, step: int) -> list:
    """step_<N> directories under `root` with N > step, oldest first."""
    return [p for p in _step_dirs(Path(root)) if step_of(p) > step]


def set_aside(root: Path, step: int) -> Optional[Path]:
    """Move every step_<N> with N > step into <root>/set_aside/after_step_<step>[_k]/, where
    neither --resume auto nor pruning sees them; return that directory (None: nothing later)."""
    later = later_steps(root, step)
    if not later:
        return None
    parent = Path(root) / SET_ASIDE
    parent.mkdir(exist_ok=True)
    dst, k = parent / f"after_step_{step}", 1
    while dst.exists():
        k += 1
        dst = parent / f"after_step_{step}_{k}"
    dst.mkdir()
    for path in later:
        os.rename(path, dst / path.name)
    _fsync_dir(Path(root))
    return dst


def unmovable(root: Path, step: int) -> Optional[str]:
    """Why the checkpoints later than `step` under `root` could not be set aside, or None.
    Moving a directory to another parent needs write permission on both parents and on the
    directory itself (its '..' entry changes; rename(2), EACCES)."""
    later = later_steps(root, step)
    blocked = [p for p in [Path(root), *later] if not os.access(p, os.W_OK)] if later else []
    if not blocked:
        return None
    return (f"{', '.join(p.name for p in later)} under {root} (later than step_{step}) must be moved aside so the "
            f"resumed run's own checkpoints are the newest, but {blocked[0]} is not writable")


def load_checkpoint(path: Path, net, optimizer) -> dict:
    """Load weights into `net` and state into `optimizer` (MindSpore's load: how a step whose
    states are the graph's Parameters loads, checkpoints/contract.py); return the sidecar."""
    import mindspore as ms  # imported here: --help imports this module; MindSpore, only to save or load

    state = read_state(path)
    if state is None:
        raise CheckpointError(f"{path} is not a complete checkpoint")
    # Both files are read (and CRC-checked) before either is loaded, so a damaged one
    # leaves the network and optimizer untouched.
    contents = {}
    for name in (WEIGHTS, OPTIMIZER):
        try:
            contents[name] = ms.load_checkpoint(str(path / name), crc_check=True)
        except (ValueError, RuntimeError, OSError) as exc:
            raise CheckpointError(f"{path / name} is damaged or unreadable ({exc})") from exc
    not_loaded, _ = ms.load_param_into_net(net, contents[WEIGHTS], strict_load=True)
    # Only what this rank owns must be there: a pipeline stage's file holds its own stage.
    missing = [n for n in not_loaded if n in {p.name for p in owned(net.trainable_params())}]
    if missing:
        raise CheckpointError(f"{path / WEIGHTS} lacks trained weights: {', '.join(missing[:5])}")
    ms.load_param_into_net(optimizer, contents[OPTIMIZER], strict_load=True)
    return state
