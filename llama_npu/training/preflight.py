"""Pre-flight: everything a run needs is checked before its output directory is touched.

`train` runs these checks first and refuses on any problem (one line, exit 2) before it
tokenizes, deletes (--overwrite) or writes anything; `validate` runs the same checks and
lists every problem it finds. Problems are collected as one-line strings rather than
raised, so that one bad key does not hide the next.

Pure Python and file reads only: no MindSpore import, so a refused run costs a second.
"""
from __future__ import annotations

import glob
import json
import shlex
from pathlib import Path
from typing import Callable, Optional

from ..checkpoints.files import (CheckpointError, checkpoint_root, inspect, problem, rank_roots, read_state,
                                 step_dirs_newest_first, unmovable, warn_once)
from ..common.atomic import unwritable_reason
from ..common.checksums import MANIFEST, check, listed
from ..common.console import note
from ..common.launcher import local_workers
from ..data.dataset_info import eval_inputs, train_inputs
from ..data.readers import RecordError, iter_records, with_skip_hint
from ..data.record_kind import RecordKind
from ..data.tables import ReadOptions
from ..data.tokenizer import TokenizerError, load_tokenizer, tokenizer_identity
from ..data.truncation import BEFORE_THE_KEY
from ..objectives import OBJECTIVES, of as objective_of, records_of
from ..recipe.base_weights import CHECKPOINT_PLACEHOLDER, check_base
from ..recipe.problems import RecipeError
from ..recipe.resume_checks import check_resume_recipe, recipe_difference
from ..recipe.schema import Recipe
from ..recipe.stored import STORED_RECIPE, stored_recipe
from ..strategies.parallel import check_workers
from ..weights.errors import ConvertError

# Changing one of these on resume would train a different model, on different data, or give
# each step different samples than the checkpoint's run did: refused without --force
# (recipe/resume_checks.py compares; the objectives' sections are named here, above recipe/).
# Everything else (max_steps, save/eval cadence, lr and schedule, precision, recompute,
# chunked CE, device) may change: lowering the lr or enabling loss scaling is how a
# diverged run is recovered (training/nonfinite.py NonFiniteStreak says so), and memory
# strategies do not change the maths.
RESULT_KEYS = ("model.", "data.", "train.micro_batch_size", "train.global_batch_size", "train.seed",
               "strategies.lora.", "strategies.parallel.", "train.objective",
               *(f"{objective.NAME}." for objective in OBJECTIVES if objective.SECTION))


class RunDirError(RuntimeError):
    """The output directory cannot be used as asked (exists, no checkpoint to resume...)."""


class PreflightError(RuntimeError):
    """Problems found before the run: one line for `train`, every line for `validate`."""

    def __init__(self, problems: list):
        self.problems = problems
        more = (f" (and {len(problems) - 1} more: llama-npu validate with the same arguments lists them all)"
                if len(problems) > 1 else "")
        super().__init__(problems[0] + more)


def _collect(problems: list, check: Callable, *args):
    """Run one check; a user error it raises becomes one problem line."""
    try:
        return check(*args)
    except (RecipeError, RecordError, TokenizerError, ConvertError, CheckpointError, RunDirError,
            FileNotFoundError) as exc:
        problems.extend(getattr(exc, "problems", [str(exc)]))
    return None


# ---------------------------------------------------------------- device

def ascend_devices() -> list:
    """The NPUs' device nodes: the driver creates /dev/davinciN per card, and a container sees
    only the cards passed to it (docker --device /dev/davinciN). Cheaper than `npu-smi info`,
    which doctor runs, and true for the same hosts."""
    return sorted(glob.glob("/dev/davinci[0-9]*"))


def check_device(recipe: Recipe) -> list:
    if recipe.device.target != "ascend" or ascend_devices():
        return []
    return [f"device.target=ascend (device.name={recipe.device.name}): this host has no Ascend NPU "
            f"(no /dev/davinci* device); `llama-npu doctor` says what it can train, and "
            f"`llama-npu train RECIPE --rehearse` rehearses the recipe on the CPU"]


# ---------------------------------------------------------------- host memory

def mem_available() -> Optional[int]:
    """The kernel's estimate of the memory a new process can take without swapping
    (/proc/meminfo MemAvailable), in bytes; None where there is no /proc."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_host_memory(recipe: Recipe) -> list:
    """With the optimizer on the host: the planner's host figure for this node's ranks
    against MemAvailable, so that a host short of it refuses now, not after it has swapped."""
    from ..memory.planner import host_bytes  # imported here: only a recipe with offload needs the planner

    rank = host_bytes(recipe)
    available = mem_available()
    ranks = local_workers()
    if not rank or available is None or rank * ranks <= available:
        return []
    gib = 2**30
    return [f"strategies.offload.optimizer=host: this node's host needs {rank * ranks / gib:.2f} GiB for the fp32 "
            f"master weights, the moments and the accumulators ({ranks} rank{'s' if ranks > 1 else ''} x "
            f"{rank / gib:.2f} GiB, llama-npu plan RECIPE), but MemAvailable is {available / gib:.2f} GiB; free "
            f"memory, use more data-parallel ranks (each holds 1/N), or set strategies.offload.optimizer: device"]


def check_host_kernel(recipe: Recipe) -> list:
    """With the optimizer on the host: its AdamW kernel importable, at the offload extra's
    release, and right on this host (one tiny update), so that a host without it refuses
    before tokenizing, not when the session builds the host optimizer."""
    from ..strategies.offload import on_host
    from ..steps.host.kernel_check import INSTALL, kernel_problem

    if not on_host(recipe):
        return []
    problem = kernel_problem()
    return [f"strategies.offload.optimizer=host: the host's AdamW kernel cannot run here: {problem}; "
            f"install it: {INSTALL}"] if problem else []


# ---------------------------------------------------------------- data

BAD_RECORDS_LISTED = 20


def _file_bad_records(path: str, fmt: str, options: ReadOptions, kind: RecordKind) -> tuple[list, list]:
    """(every bad record, every good one) of one file, read with the reader train uses
    (data/readers.py; `kind`: the objective's records); a file of which no record parses
    (most often another format, or another objective's records) is one error instead."""
    bad, good = [], []
    try:
        for item in iter_records([path], fmt, options, kind):
            (bad if isinstance(item, RecordError) else good).append(item)
    except OSError as exc:
        raise RecordError(f"{path}: cannot read it ({exc.strerror})") from None
    if bad and not good and kind.none_in_file and all(error.reason == kind.not_mine for error in bad):
        raise RecordError(kind.none_in_file(path))
    if bad and not good:
        raise RecordError(f"data.format={fmt}: no record of {path} parses; the first: {bad[0]}")
    return bad, good


def check_records(recipe: Recipe, tokenizer=None) -> list:
    """Problems of the training and held-out data (data/dataset_info.py): each bad record (the first
    BAD_RECORDS_LISTED, then a count) unless data.on_bad_record is skip. With a `tokenizer` the
    objective's `preflight` (DPO: a prompt too long for a reply) checks its good records too."""
    d, problems, bad = recipe.data, [], []
    objective = objective_of(recipe)
    kind = records_of(objective)
    inputs = _collect(problems, lambda: train_inputs(recipe) + eval_inputs(recipe)) or []
    for data_input, path in ((i, path) for i in inputs for path in i.files):
        errors, good = _collect(problems, _file_bad_records, path, data_input.format, data_input.options,
                                kind) or ([], [])
        bad += errors + (objective.preflight(recipe, tokenizer, good) if tokenizer else [])
    if d.on_bad_record == "error":
        problems += [str(with_skip_hint(error)) for error in bad[:BAD_RECORDS_LISTED]]
        if len(bad) > BAD_RECORDS_LISTED:
            problems.append(f"data: {len(bad) - BAD_RECORDS_LISTED} more bad records ({len(bad)} in all); fix "
                            f"them, or set data.on_bad_record: skip to train on the rest")
    return problems


def check_prepared(recipe: Recipe, rehearsal: bool = False) -> None:
    """data.prepared is whole (every file by its checksums.json) and was made for this
    recipe: its length (a rehearsal reads longer rows cut to its own, data/mindrecord.window)
    and its tokenizer."""
    # imported here: it loads numpy, which validate does not need
    from ..data.mindrecord import META_FILE, data_files, read_meta

    d = recipe.data
    verdict = check(Path(d.prepared), listed(Path(d.prepared)))
    if verdict.problem:
        raise RunDirError(f"data.prepared={d.prepared}: {verdict.problem}; prepare it again")
    if not verdict.has_manifest and (Path(d.prepared) / META_FILE).is_file():
        warn_once(f"data.prepared={d.prepared} has no {MANIFEST} (prepared by a llama-npu older than it): its files "
                  f"are read unverified; prepare it again to have them checked")
    meta = read_meta(Path(d.prepared))
    for name in data_files(meta):
        if not (Path(d.prepared) / name).is_file():
            raise RunDirError(f"data.prepared={d.prepared}: {name} is missing; prepare it again")
    if meta["max_seq_len"] != d.max_seq_len and not (rehearsal and meta["max_seq_len"] > d.max_seq_len):
        raise RecipeError(f"data.prepared={d.prepared} was prepared with --max-seq-len {meta['max_seq_len']}, "
                          f"but data.max_seq_len={d.max_seq_len}")
    # a directory prepared before meta.json named it was made in the one template there was
    if meta.get("template", "llama3") != d.template:
        raise RecipeError(f"data.prepared={d.prepared} was prepared in the {meta['template']} chat template, but "
                          f"data.template={d.template}; prepare it again, or set data.template: {meta['template']}")
    made = meta.get("truncation", BEFORE_THE_KEY)  # a directory older than the key holds keep_prompt's cuts
    if made != d.truncation:
        raise RecipeError(f"data.prepared={d.prepared} was prepared under --truncation {made}, but data.truncation="
                          f"{d.truncation}; prepare it again with --truncation {d.truncation}, or set "
                          f"data.truncation: {made}")
    if meta["tokenizer"]["sha256"] != tokenizer_identity(d.tokenizer)["sha256"]:
        raise RecipeError(f"data.prepared={d.prepared} was tokenized with {meta['tokenizer']['name']}, "
                          f"not data.tokenizer={d.tokenizer}")


def check_data(recipe: Recipe, rehearsal: bool = False) -> list:
    d, problems = recipe.data, []
    tokenizer = _collect(problems, load_tokenizer, d.tokenizer)
    if d.prepared:
        if not problems:  # the tokenizer comparison needs the tokenizer
            _collect(problems, check_prepared, recipe, rehearsal)
    return problems + check_records(recipe, tokenizer)


# ---------------------------------------------------------------- pre-trained weights

def check_rehearsed_recipe(recipe: Recipe) -> list:
    """A rehearsal stands in for the full recipe: its data and weights are checked as given."""
    return check_data(recipe) + check_weights(recipe, rehearsal=True)


def check_weights(recipe: Recipe, rehearsal: bool = False) -> list:
    """Problems of the weights a run starts from (recipe/base_weights.py), then of the
    model.checkpoint it names."""
    problems = []
    _collect(problems, check_base, recipe, rehearsal)
    if recipe.model.checkpoint and recipe.model.checkpoint != CHECKPOINT_PLACEHOLDER:
        from ..weights.pretrained import check_pretrained  # imported here: it loads numpy, which validate does not need

        _collect(problems, check_pretrained, recipe)
    return problems


# ---------------------------------------------------------------- output directory

def resume_candidates(run_dir: Path, resume: Optional[str]) -> list:
    """The checkpoints to resume from, newest first: with `auto`, the steps complete on every
    rank (checkpointer.Checkpointer.choose reads them against their CRC and takes the newest
    good one); raises when there is none that could be."""
    if resume == "auto":
        roots = rank_roots(run_dir) or [checkpoint_root(run_dir)]
        found = step_dirs_newest_first(roots[0])  # a step missing on rank 0 is complete nowhere
        complete = [path for path in found if all(read_state(root / path.name) is not None for root in roots)]
        if found and not complete:
            reasons = "; ".join(f"{path.name}: {next(filter(None, (problem(r / path.name) for r in roots)))}"
                                for path in found)
            where = roots[0] if len(roots) == 1 else f"{checkpoint_root(run_dir)} (on every rank)"
            raise RunDirError(f"resume: none of the checkpoints under {where} is complete ({reasons}); pass "
                              f"--resume PATH to pick one, or --overwrite to start again")
        return complete
    path = Path(resume)
    reason = problem(path) if path.is_dir() else "no such directory"
    if reason:
        raise RunDirError(f"--resume {path}: not a complete checkpoint directory ({reason}); expected a step_<N> "
                          f"directory holding model.ckpt, optimizer.ckpt and state.json")
    return [path]


def check_rewind(run_dir: Path, candidates: list) -> None:
    """Resuming from an older step than the run directory holds sets the later ones aside
    (checkpointer.Checkpointer.start_branch); refuse now, before anything is written, when
    they could not be moved."""
    if not candidates:
        return
    step = inspect(candidates[0])[0]["step"]
    for root in rank_roots(run_dir) or [checkpoint_root(run_dir)]:
        reason = unmovable(root, step)
        if reason:
            raise RunDirError(f"resume: {reason}; fix the permissions, or resume into another --output-dir")


def check_output_dir(run_dir: Path, resume: Optional[str], overwrite: bool,
                     main_rank: bool = True) -> tuple[list, list]:
    """(problems, checkpoints to resume from). Under msrun only rank 0 writes the run
    directory, so only it judges whether it may."""
    problems, candidates = [], []
    if resume and overwrite:
        problems.append("--resume and --overwrite exclude each other")
    elif resume:
        candidates = _collect(problems, resume_candidates, run_dir, resume) or []
        if main_rank:  # rank 0 sets the later checkpoints aside
            _collect(problems, check_rewind, run_dir, candidates)
    elif main_rank and run_dir.is_dir() and any(run_dir.iterdir()) and not overwrite:
        problems.append(f"output directory {run_dir} is not empty; pass --resume auto to continue it or "
                        f"--overwrite to start again")
    reason = unwritable_reason(run_dir) if main_rank else None
    if reason:
        problems.append(f"output directory {run_dir} is not writable: {reason}")
    return problems, candidates


# ---------------------------------------------------------------- all of them

def preflight(recipe: Recipe, run_dir: Optional[Path], resume: Optional[str], overwrite: bool,
              force: bool = False, workers: int = 1, main_rank: bool = True,
              rehearsal: bool = False) -> tuple[list, list]:
    """(every problem that would stop this run, one line each, [] when it can start;
    the checkpoints to resume from, newest first). Without a run_dir the output directory
    is not judged (`validate RECIPE` alone)."""
    # Without the device, the host is not the one that will train (a login node): its memory and
    # its kernel for the optimizer on the host are not judged.
    problems = check_device(recipe) or check_host_memory(recipe) + check_host_kernel(recipe)
    _collect(problems, check_workers, recipe.strategies.parallel, workers)
    problems += check_data(recipe, rehearsal) + check_weights(recipe)
    if run_dir is None:
        return problems, []
    output_problems, candidates = check_output_dir(run_dir, resume, overwrite, main_rank)
    problems += output_problems
    if resume:
        problems += _collect(problems, check_resume_recipe, recipe, run_dir, force, RESULT_KEYS) or []
    return problems, candidates


def checked_start(recipe: Recipe, run_dir: Path, resume: Optional[str], overwrite: bool, force: bool, workers: int,
                  main_rank: bool, rehearsal: bool) -> tuple[Optional[list], bool]:
    """`train`'s pre-flight: PreflightError on any problem, else (the checkpoints to resume
    from, newest first, None when no resume was asked; whether run_dir has no stored recipe
    to compare the checkpoint's with)."""
    problems, candidates = preflight(recipe, run_dir, resume, overwrite, force, workers, main_rank,
                                     rehearsal=rehearsal)
    if problems:
        raise PreflightError(problems)
    stored = stored_recipe(run_dir) if resume else None
    if stored is not None:
        difference = recipe_difference(stored, recipe, RESULT_KEYS)
        if difference.changed:
            note(f"resuming with {difference.describe(difference.changed)}, unlike {run_dir / STORED_RECIPE} "
                 f"(kept as it was)")
    if resume == "auto" and not candidates:
        note(f"resume: no checkpoint under {run_dir}/checkpoints; starting at step 0")
    return (candidates if resume else None), stored is None


def _set_value(value) -> str:
    """A recipe value as `--set` reads it back (YAML): strings bare, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def resume_command(run_dir: Path, recipe: Recipe) -> str:
    """The command that continues this run exactly: its own recipe.yaml, plus a --set for
    each key this run changed from it (and --force when one of them needed it)."""
    difference = recipe_difference(stored_recipe(run_dir), recipe, RESULT_KEYS)
    words = ["llama-npu", "train", "--resume", "auto", "--output-dir", str(run_dir)]
    for key, (_, value) in difference.changed.items():
        words += ["--set", f"{key}={_set_value(value)}"]
    if difference.refused:
        words.append("--force")
    return " ".join(shlex.quote(word) for word in words)
