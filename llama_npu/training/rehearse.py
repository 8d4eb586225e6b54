"""`train RECIPE --rehearse`: the recipe shrunk until it trains a few steps on a laptop's
CPU, with every strategy the CPU can run kept as the recipe sets it.

Shrunk: the model (the tiny preset), the sequence (a data.prepared directory is kept, its
rows read as windows of the short sequence; an objective's records as it shrinks them,
objectives/: DPO's pairs a length that leaves their prompts room for a reply, and as many
pairs as the steps read),
the batch, the steps, the device.
Kept: precision and loss scaling (BF16 becomes FP16: the CPU has no BF16 kernels), LoRA,
recompute, chunked cross-entropy (in chunks smaller than the short sequence), gradient
accumulation (at most 2 micro-batches), evaluation, the optimizer and its schedule.
Not rehearsed, and said so: what needs an NPU (sharded layouts, flash attention, the
910A's overflow registers, device memory), and data parallel unless it runs on several
processes (scripts/launch.sh RECIPE N --rehearse: data parallel over N CPU workers).
Each strategy shrinks its own keys (its module's `rehearse`); this module the rest.
"""
from __future__ import annotations

from pathlib import Path

from ..model.architecture import SIZE_KEYS, resolve_shape
from ..model.llama import fused_kernels
from ..objectives import of as objective_of
from ..recipe.base_weights import random_base_reason
from ..recipe.load import recipe_from_dict
from ..recipe.schema import Recipe
from ..strategies import STRATEGIES
from ..strategies.accumulation import MAX_REHEARSED

SEQ_LEN = 32
STEPS = 3


class Rehearsal:
    """The rehearsal recipe as it is being shrunk (a mapping), with what was changed and
    what cannot be rehearsed on this CPU. `tiny`: the rehearsal model's shape; `workers`:
    the processes it runs on."""

    def __init__(self, recipe: Recipe, workers: int):
        self.recipe, self.workers = recipe, workers
        self.tree = recipe.to_dict()
        self.changed, self.not_rehearsed = [], []
        self.tiny = None  # the rehearsal model's shape, once the model is shrunk

    def change(self, key: str, value, why: str = "") -> None:
        *sections, name = key.split(".")
        node = self.tree
        for section in sections:
            node = node[section]
        if node[name] != value:
            self.changed.append(f"{key} {node[name]!r} -> {value!r}" + (f" ({why})" if why else ""))
            node[name] = value


def _checkpoint_shape(directory: str):
    """The shape a model.checkpoint directory describes, or None if it cannot be read
    (pre-flight reports why against the full recipe)."""
    # imported here: the weights format loads numpy, needless for validate
    from ..weights.pretrained import read_checkpoint_dir
    from ..weights.tensor_files import ConvertError

    try:
        return read_checkpoint_dir(Path(directory))[0]
    except (ConvertError, OSError, ValueError, KeyError, TypeError):
        return None


def rehearse(recipe: Recipe, workers: int = 1) -> tuple[Recipe, list, list]:
    """(the rehearsal recipe, what was changed, what cannot be rehearsed on this CPU).
    `workers`: the processes it runs on; more than one (scripts/launch.sh RECIPE N
    --rehearse) rehearses data parallel over them."""
    r = Rehearsal(recipe, workers)
    for shrink in (_shrink_model, _shrink_device, _shrink_data, _shrink_train):
        shrink(r)
    for strategy in STRATEGIES:
        if hasattr(strategy, "rehearse"):  # LoRA rehearses as the recipe sets it
            strategy.rehearse(r)
    rehearsal = recipe_from_dict(r.tree, workers=workers)
    r.changed += objective_of(recipe).rehearsal_notes(rehearsal)  # what its rehearsal_source takes (training/run.py)
    return rehearsal, r.changed, r.not_rehearsed


def _shrink_model(r: Rehearsal) -> None:
    m = r.recipe.model
    if m.preset != "tiny":  # a tiny recipe, size overrides and all, is small enough already
        r.change("model.preset", "tiny")
        for name in SIZE_KEYS:
            r.change(f"model.{name}", None)
    r.tiny = resolve_shape(type(m)(**r.tree["model"]))
    if m.checkpoint and _checkpoint_shape(m.checkpoint) != r.tiny:
        r.change("model.checkpoint", "", "it holds another shape; the tiny model starts from random weights")
        r.not_rehearsed.append(f"loading model.checkpoint={m.checkpoint} (its path and shape were checked "
                               f"against the full recipe)")
    if not m.checkpoint:  # said here, in the summary: the full recipe would train over the same random base
        r.changed.append(f"the base is random weights: {random_base_reason(r.recipe)}")
    if not r.tree["model"]["checkpoint"]:  # the tiny model starts from random weights, as the summary says
        r.tree["model"]["random_init"] = True


def _shrink_device(r: Rehearsal) -> None:
    device = r.recipe.device
    if device.target != "cpu":
        kernels = "flash attention, the fused RmsNorm" if fused_kernels(True, device.name) else \
            "its attention and RmsNorm kernels"
        r.not_rehearsed.append(f"the {device.name}'s kernels ({kernels}) and its "
                               f"device memory: `llama-npu plan` estimates that memory")
    r.change("device.target", "cpu")
    r.change("device.name", "cpu")
    r.change("device.max_device_memory", "")


def _shrink_data(r: Rehearsal) -> None:
    d = r.recipe.data
    seq_len = min(d.max_seq_len, SEQ_LEN)
    # DPO: a pair's prompt must leave room for its reply
    seq_len = objective_of(r.recipe).rehearse_length(r, seq_len, STEPS * MAX_REHEARSED * r.workers)
    r.change("data.max_seq_len", seq_len)
    if d.prepared and seq_len < d.max_seq_len:
        r.changed.append(f"data.prepared={d.prepared}: its {d.max_seq_len + 1}-token rows read as windows of "
                         f"{seq_len + 1} around their first target token")


def _shrink_train(r: Rehearsal) -> None:
    r.change("train.micro_batch_size", 1)
    r.change("train.max_steps", STEPS)
    r.change("train.epochs", None, f"{STEPS} steps instead")
    r.change("train.warmup_steps", min(r.recipe.train.warmup_steps, 1))
    r.change("train.save_every", STEPS)
    r.change("train.eval_every", 0, "evaluated once, at the end")
