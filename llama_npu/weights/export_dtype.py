"""The dtype `convert ms-to-hf` writes, and why: a run's fp32 master weights are no reason to
export fp32. LLaMA-Factory's export writes the dtype of the model the run started from, its
config's torch_dtype, and bf16 or fp16 when that is fp32 (train/tuner.py export_model; the
half dtype from model_args.compute_dtype). So here:

- --dtype, when given;
- a run's checkpoint: the dtype of the model it started from (the Hugging Face config's
  torch_dtype, which `convert hf-to-ms` keeps in its config.json, else the dtype of that
  source's tensors), when that is half; from random weights or an fp32 source, the dtype the
  run computed in (strategies.precision: float16 under O2 float16, float32 under O0);
- a converted directory: the dtype it was converted from (its source's tensors).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Tuple

from ..model.precision_dtypes import model_dtypes
from ..recipe.stored import owning_recipe

HALF = ("bfloat16", "float16")
TENSOR_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def source_dtype(meta: dict) -> Optional[str]:
    """The dtype of the Hugging Face model a converted directory came from: its config's
    torch_dtype (transformers 4.56 and later write `dtype`), else its tensors'; None for none."""
    config = meta.get("hf_config") or {}
    named = config.get("torch_dtype") or config.get("dtype")
    if named in (*HALF, "float32"):
        return named
    stored = meta.get("source_dtypes") or []
    return TENSOR_DTYPES.get(stored[0]) if stored else None


def export_dtype(asked: Optional[str], meta: dict, weights: Path) -> Tuple[str, str]:
    """(dtype, why) of an export of `weights` (a model.ckpt) whose base directory's config.json
    holds `meta`."""
    if asked:
        return asked, "--dtype"
    run = owning_recipe(Path(weights).parent)
    if run is None:  # a converted directory
        dtype = source_dtype(meta) or "float32"
        return dtype, f"the dtype it was converted from ({dtype}); --dtype writes another"
    base = meta
    if run.model.checkpoint and Path(run.model.checkpoint, "config.json").is_file():
        from .pretrained import read_checkpoint_dir  # imported here: it loads numpy

        base = read_checkpoint_dir(Path(run.model.checkpoint))[1]
    started = source_dtype(base) if run.model.checkpoint else None
    if started in HALF:
        return started, f"the dtype of the model the run started from ({run.model.checkpoint}: {started})"
    computed = model_dtypes(run.strategies.precision)["compute_dtype"]
    start = f"a {started} model" if started else "random weights"
    p = run.strategies.precision
    return computed, (f"the run started from {start}, so the dtype it computed in (strategies.precision "
                      f"amp_level {p.amp_level}{'' if p.amp_level == 'O0' else ', dtype ' + p.dtype}); "
                      f"--dtype writes another")
