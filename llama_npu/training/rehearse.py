"""`train RECIPE --rehearse`: the recipe shrunk until it trains a few steps on a laptop's
CPU, with every strategy the CPU can run kept as the recipe sets it.

Shrunk: the model (the tiny preset), the sequence (a data.prepared directory is kept, its
rows read as windows of the short sequence), the batch, the steps, the device.
Kept: precision and loss scaling (BF16 becomes FP16: the CPU has no BF16 kernels), LoRA,
recompute, chunked cross-entropy (in chunks smaller than the short sequence), gradient
accumulation (at most 2 micro-batches), evaluation, the optimizer and its schedule.
Not rehearsed, and said so: what needs an NPU (sharded layouts, flash attention, the
910A's overflow registers, device memory), and data parallel unless it runs on several
processes (scripts/launch.sh RECIPE N --rehearse: data parallel over N CPU workers).
"""
from __future__ import annotations

from pathlib import Path

from ..model.architecture import SIZE_KEYS, resolve_shape
from ..model.llama import fused_kernels
from ..recipe.schema import Recipe, accumulation_steps, recipe_from_dict
from ..strategies.parallel import is_sharded, pipeline_micro_batches

SEQ_LEN = 32
STEPS = 3
MAX_ACCUMULATION = 2
CHUNK = 16  # chunked CE must still cut the rehearsal's 32-token sequences into pieces


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
    tree = recipe.to_dict()
    changed, not_rehearsed = [], []

    def change(key: str, value, why: str = "") -> None:
        *sections, name = key.split(".")
        node = tree
        for section in sections:
            node = node[section]
        if node[name] != value:
            changed.append(f"{key} {node[name]!r} -> {value!r}" + (f" ({why})" if why else ""))
            node[name] = value

    m, d, t, s = recipe.model, recipe.data, recipe.train, recipe.strategies
    if m.preset != "tiny":  # a tiny recipe, size overrides and all, is small enough already
        change("model.preset", "tiny")
        for name in SIZE_KEYS:
            change(f"model.{name}", None)
    tiny = resolve_shape(type(m)(**tree["model"]))
    if m.checkpoint and _checkpoint_shape(m.checkpoint) != tiny:
        change("model.checkpoint", "", "it holds another shape; the tiny model starts from random weights")
        not_rehearsed.append(f"loading model.checkpoint={m.checkpoint} (its path and shape were checked "
                             f"against the full recipe)")

    if recipe.device.target != "cpu":
        kernels = "flash attention, the fused RmsNorm" if fused_kernels(True, recipe.device.name) else \
            "its attention and RmsNorm kernels"
        not_rehearsed.append(f"the {recipe.device.name}'s kernels ({kernels}) and its "
                             f"device memory: `llama-npu plan` estimates that memory")
        if recipe.device.name == "910a" and s.precision.loss_scale != "none":
            not_rehearsed.append("the 910A's overflow registers: on the CPU loss scaling checks gradients "
                                 "with is-finite")
    change("device.target", "cpu")
    change("device.name", "cpu")
    change("device.max_device_memory", "")
    if s.precision.amp_level != "O0" and s.precision.dtype == "bfloat16":
        change("strategies.precision.dtype", "float16", "the CPU has no BF16 kernels")

    seq_len = min(d.max_seq_len, SEQ_LEN)
    change("data.max_seq_len", seq_len)
    if d.prepared and seq_len < d.max_seq_len:
        changed.append(f"data.prepared={d.prepared}: its {d.max_seq_len + 1}-token rows read as windows of "
                       f"{seq_len + 1} around their first target token")

    par = s.parallel
    # a pipeline's micro-batches are its accumulation (accumulation_steps is 1 there)
    accumulation = min(pipeline_micro_batches(par) * accumulation_steps(recipe), MAX_ACCUMULATION)
    change("train.micro_batch_size", 1)
    change("train.global_batch_size", accumulation * workers if accumulation > 1 else 0,
           f"{accumulation} micro-batches accumulated per step" if accumulation > 1 else "")
    change("train.max_steps", STEPS)
    change("train.warmup_steps", min(t.warmup_steps, 1))
    change("train.save_every", STEPS)
    change("train.eval_every", 0, "evaluated once, at the end")
    if s.chunked_ce.enabled:
        change("strategies.chunked_ce.chunk_size", min(s.chunked_ce.chunk_size, CHUNK))
    if s.recompute.layers > tiny.num_layers:
        change("strategies.recompute.layers", tiny.num_layers)

    if par.data > 1 and workers == 1:
        not_rehearsed.append(f"data parallel over {par.data} processes: the rehearsal is one process "
                             f"(scripts/launch.sh RECIPE N --rehearse rehearses it over N CPU processes)")
    if is_sharded(par):
        layout = (f"data {par.data} x model {par.model} x pipeline {par.pipeline}"
                  f"{', optimizer sharded' if par.optimizer_shard else ''}")
        not_rehearsed.append(f"the sharded layout ({layout}): semi_auto_parallel needs Ascend; it was "
                             f"validated, and the rehearsal runs unsharded on {workers} process(es)")
    for key, value in (("data", workers), ("model", 1), ("pipeline", 1), ("micro_batches", 1),
                       ("optimizer_shard", False), ("sequence_parallel", False)):
        change(f"strategies.parallel.{key}", value, "the processes it runs on" if key == "data" else "")
    return recipe_from_dict(tree, workers=workers), changed, not_rehearsed
