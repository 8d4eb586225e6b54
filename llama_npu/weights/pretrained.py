"""Pretrained weights into a built network: the one loader train, eval, generate and
ms-to-hf share.

`check_pretrained(recipe)` checks model.checkpoint against the recipe (its files against
their checksums, its config.json, then each tensor's name and shape, read from the file's
record headers without building the model), so damage or a mismatch is one line before
anything is tokenized or written. It has no side effects.

`load_weights` casts each tensor to the dtype its Parameter has in the network the recipe
built, so a float32 or float16 conversion loads under any amp level, LoRA or not:
MindFormers keeps the norms in float32 while O3 (and LoRA's frozen base) store the linear
weights in the compute dtype.

`resolve_weights` tells apart what eval, generate and ms-to-hf accept: a converted directory
or a full fine-tune's step directory (both have config.json), and a run directory or a LoRA
step directory, whose adapters are folded into the base its recipe names (model.checkpoint).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional

import numpy as np

from ..checkpoints.files import CheckpointError, damage, problem, step_dirs_newest_first, verify_read, warn_once
from ..common.checksums import SIDECAR_BYTES, read_sidecar
from ..data.tables import ReadOptions
from ..data.truncation import DEFAULT as TRUNCATION_DEFAULT
from ..model.architecture import LARGEST, PRESETS, LlamaShape, resolve_shape, shape_problem
from ..recipe.problems import RecipeError
from ..recipe.stored import STORED_RECIPE, stored_recipe
from .tensor_files import (CONFIG, INT8_SCALE, LINEAR, LORA_A, WEIGHTS, ConvertError, StoredTensor, ckpt_index,
                           dequantize, expected_shapes, int8_rounded, lora_factors, rename, to_float32)


def expected_tensors(shape: LlamaShape) -> Dict[str, tuple]:
    """MindFormers parameter name -> shape of every weight a Llama 3.2 of `shape` has."""
    return {rename(name, to_ms=True): dims for name, dims in expected_shapes(shape).items()}


# ---------------------------------------------------------------- the file's record headers

def checkpoint_tensors(path: Path) -> Dict[str, StoredTensor]:
    """name -> where each tensor of a MindSpore .ckpt is (weights_format.ckpt_index)."""
    try:
        return ckpt_index(path)
    except (EOFError, ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not a readable MindSpore checkpoint ({exc})") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot be read ({exc.strerror})") from None


def tensor_index(path: Path) -> Dict[str, tuple]:
    """name -> shape of every tensor in a MindSpore .ckpt, from its record headers."""
    return {name: tensor.shape for name, tensor in checkpoint_tensors(path).items()}


def read_adapters(path: Path) -> Dict[str, np.ndarray]:
    """A LoRA step's model.ckpt as float32 arrays (adapters are small: read whole)."""
    return {name: to_float32(t.read(), t.code) for name, t in checkpoint_tensors(path).items()}


def read_checkpoint_dir(src: Path) -> tuple[LlamaShape, dict]:
    """(shape, config.json) of a directory written by convert hf-to-ms (or a full step)."""
    path = Path(src) / CONFIG
    if not path.is_file():
        raise ConvertError(f"{src}: no {CONFIG}; expected a directory written by llama-npu convert hf-to-ms")
    meta = json_object(path, SIDECAR_BYTES)
    if meta.get("format") != "llama-npu":
        hint = (" (a Hugging Face directory: convert it first with llama-npu convert hf-to-ms --src "
                f"{src} --dst DIR)" if meta.get("model_type") else "")
        raise ConvertError(f"{path}: not a llama-npu checkpoint description{hint}")
    shape = meta.get("shape")
    problem_found = (shape_problem(shape, {name: f"shape.{name}" for name in shape}) if isinstance(shape, dict)
                     and set(shape) == set(LARGEST) else f"shape={shape!r}; expected {sorted(LARGEST)}")
    if problem_found:
        raise ConvertError(f"{path}: {problem_found}")
    return LlamaShape(**shape), meta


def json_object(path: Path, limit: int = 1 << 26) -> dict:
    """A JSON file's object (a config.json; a tokenizer.json is 17 MB), or one line naming the
    file. Read within `limit` bytes and only as a regular file: a link to /dev/zero is refused,
    not read for ever."""
    try:
        value = json.loads(read_sidecar(Path(path), limit))
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: thousands of nested brackets
        raise ConvertError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ConvertError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def verify_tensors(found: Dict[str, tuple], shape: LlamaShape, source) -> None:
    """Every weight of a `shape` model is in `found` (name -> shape) with its shape, or one
    line naming the first that is not."""
    expected = expected_tensors(shape)
    missing = [name for name in expected if name not in found]
    if missing:
        raise CheckpointError(f"{source}: lacks tensor {missing[0]} ({len(missing)} of {len(expected)} model "
                              f"tensors missing)")
    for name, dims in expected.items():
        if found[name] != dims:
            raise CheckpointError(f"{source}: tensor {name} has shape {found[name]}, the model needs {dims}")


def verify_scales(found: dict, source) -> None:
    """Every decoder linear weight of a quantized checkpoint (`found`: name -> shape) has its
    fp32 scale, one per output channel; else one line naming the tensor."""
    for name, dims in found.items():
        if not LINEAR.match(name):
            continue
        scale = found.get(name + INT8_SCALE)
        if scale is None:
            raise CheckpointError(f"{source}: tensor {name + INT8_SCALE} is missing (a quantized checkpoint "
                                  f"holds one scale per output channel of {name})")
        if tuple(scale) != (dims[0],):
            raise CheckpointError(f"{source}: tensor {name + INT8_SCALE} has shape {tuple(scale)}, expected "
                                  f"({dims[0]},): one scale per output channel of {name} {tuple(dims)}")


def run_start_hint(run_dir: Path) -> str:
    """What to give model.checkpoint instead of a run directory (for a new run from its weights,
    such as DPO after SFT): one of its full steps, or a LoRA run's export."""
    if stored_recipe(run_dir).strategies.lora.enabled:
        return (f"a LoRA run's steps hold its adapters only: export it with llama-npu convert ms-to-hf --src "
                f"{run_dir} --dst HF, convert that back with hf-to-ms, and give that directory")
    try:
        return f"give one of its steps, such as its newest complete one: model.checkpoint={_newest_step(run_dir)}"
    except CheckpointError as exc:
        return str(exc)


def pretrained_source(recipe, wanted: LlamaShape) -> tuple[Path, LlamaShape, dict]:
    """(directory, shape, config) of model.checkpoint, checked against `recipe`'s model of
    shape `wanted`."""
    directory = Path(recipe.model.checkpoint)
    if not directory.is_dir():
        raise CheckpointError(f"model.checkpoint={directory}: no such directory (expected one written by "
                              f"llama-npu convert hf-to-ms)")
    if (directory / STORED_RECIPE).is_file():
        raise CheckpointError(f"model.checkpoint={directory}: a run directory; {run_start_hint(directory)}")
    if (directory / WEIGHTS).is_file():
        verify_read([directory / CONFIG, directory / WEIGHTS])
    try:
        shape, meta = read_checkpoint_dir(directory)
    except ConvertError as exc:
        raise CheckpointError(f"model.checkpoint={exc}") from None
    if shape != wanted:
        # A newcomer's commonest case: the tiny model of scripts/make_tiny_hf_model.py given to a 1B recipe.
        preset = next((name for name, known in PRESETS.items() if known == shape), None)
        hint = (f"; it is model.preset: {preset}" + (", as in recipes/cpu_smoke.yaml" if preset == "tiny" else "")
                if preset else "")
        raise RecipeError(f"model.checkpoint={directory} holds {shape.describe()}, but model.preset="
                          f"{recipe.model.preset} is {wanted.describe()}{hint}")
    if meta.get("quantization") and not recipe.strategies.lora.enabled:
        raise RecipeError(f"model.checkpoint={directory} is quantized (int8, by llama-npu quantize): a full "
                          f"fine-tune trains every weight, which int8 cannot hold; start from the float "
                          f"conversion, or train LoRA over it (strategies.lora.enabled=true)")
    if not (directory / WEIGHTS).is_file():
        raise CheckpointError(f"model.checkpoint={directory}: no {WEIGHTS}")
    return directory, shape, meta


def check_pretrained(recipe) -> None:
    """Raise RecipeError / CheckpointError (one line) when model.checkpoint cannot start
    `recipe`'s model. Reads the files once for their checksums, then config.json and the
    checkpoint's headers only."""
    if recipe.model.checkpoint:
        directory, shape, meta = pretrained_source(recipe, resolve_shape(recipe.model))
        found = tensor_index(directory / WEIGHTS)
        verify_tensors(found, shape, directory / WEIGHTS)
        if meta.get("quantization"):
            verify_scales(found, directory / WEIGHTS)


# ---------------------------------------------------------------- reading and loading

def read_weights(path: Path, meta: dict, keep_int8: bool = False) -> dict:
    """name -> Tensor of a model.ckpt; a quantized one's int8 weights dequantized, unless
    `keep_int8` (they stay int8, their scales beside them: weights/int8_weights.py)."""
    import mindspore as ms  # imported here: validate's header check (check_pretrained) needs no MindSpore

    try:
        weights = ms.load_checkpoint(str(path))
    except (ValueError, RuntimeError, OSError) as exc:
        raise CheckpointError(f"{path} is damaged or unreadable ({exc})") from None
    if meta.get("quantization") and not keep_int8:  # int8 + scales -> the float weights they stand for
        weights = dequantized_weights(weights)
    return weights


def ms_tensor(array):
    import mindspore as ms  # imported here: validate's header check (check_pretrained) needs no MindSpore

    return ms.Tensor(array)


def dequantized_weights(weights: dict) -> dict:
    """name -> Tensor of a quantized checkpoint's weights with its int8 weights as q x s."""
    return {k: ms_tensor(v) for k, v in dequantize({k: p.asnumpy() for k, p in weights.items()}).items()}


def load_weights(net, weights: dict, shape: LlamaShape, source: Path, names=None) -> None:
    """Load every Llama weight of `weights` (or those of `names`) into `net`, each cast to its
    Parameter's dtype. Parameters the checkpoint does not describe (LoRA adapters) keep their values."""
    import mindspore as ms  # imported here: validate's header check (check_pretrained) needs no MindSpore

    verify_tensors({name: tuple(tensor.shape) for name, tensor in weights.items()}, shape, source)
    params = {p.name: p for p in net.get_parameters()}
    cast = {}
    for name in expected_tensors(shape) if names is None else names:
        tensor, dtype = weights[name], params[name].dtype
        cast[name] = ms.Parameter(tensor if tensor.dtype == dtype else tensor.astype(dtype), name=name)
    # MindSpore's own loader still does the assignment (and a sliced Parameter's layout).
    ms.load_param_into_net(net, cast, strict_load=True)


def load_pretrained(net, recipe, wanted: LlamaShape) -> tuple:
    """model.checkpoint into the freshly built network of `recipe`, of shape `wanted`
    (load_weights checks each tensor as it loads, so the header read of check_pretrained is
    not repeated). Returns (the tensors as stored, whether they are quantized): an int8 base
    (strategies.lora.base_dtype) is formed from them, not from the network's float copy."""
    directory, shape, meta = pretrained_source(recipe, wanted)
    stored = read_weights(directory / WEIGHTS, meta, keep_int8=True)
    quantized = bool(meta.get("quantization"))
    weights = dequantized_weights(stored) if quantized else stored
    load_weights(net, weights, shape, directory / WEIGHTS)
    return stored, quantized


def pretrained_hf_config(recipe) -> Optional[dict]:
    """The Hugging Face config the run started from, carried into its checkpoints."""
    if not recipe.model.checkpoint:
        return None
    return read_checkpoint_dir(Path(recipe.model.checkpoint))[1].get("hf_config")


# ---------------------------------------------------------------- what eval / generate / export take

@dataclass
class ResolvedWeights:
    base: Path  # a directory with config.json (shape, Hugging Face config)
    weights: Path  # the model.ckpt holding the full model's tensors
    adapters: Optional[Path] = None  # a LoRA step's model.ckpt, folded into `weights`
    alpha: float = 0.0
    tokenizer: str = "llama3.2"  # the run's data.tokenizer
    max_seq_len: Optional[int] = None  # the run's data.max_seq_len (None: not a run's checkpoint)
    reading: ReadOptions = field(default_factory=ReadOptions)  # the run's data.columns and data.encoding
    base_int8: bool = False  # a LoRA run over an int8 base (strategies.lora.base_dtype): folded into q x s
    truncation: str = TRUNCATION_DEFAULT  # the run's data.truncation: eval --data cuts records as it did

    def files(self) -> list:
        """Every file reading these weights reads."""
        return [self.base / CONFIG, self.weights] + ([self.adapters] if self.adapters is not None else [])


def _newest_step(run_dir: Path, verify: bool = False) -> Path:
    """The newest complete step of a run; with `verify`, the newest whose files read back
    sound, saying which newer ones were passed over and why."""
    skipped = []
    for step in step_dirs_newest_first(run_dir / "checkpoints"):
        reason = problem(step) or (damage([step / WEIGHTS, step / CONFIG]) if verify else None)
        if reason is None:
            if skipped:
                warn_once(f"{run_dir}: using {step.name}, not the newest step: "
                          + "; ".join(f"{path.name} skipped ({why})" for path, why in skipped))
            return step
        skipped.append((step, reason))
    why = f" ({'; '.join(f'{path.name}: {reason}' for path, reason in skipped)})" if skipped else ""
    raise CheckpointError(f"{run_dir}: no complete checkpoint under {run_dir / 'checkpoints'}{why}")


def _from_run(run_dir: Path, step: Path) -> ResolvedWeights:
    recipe = stored_recipe(run_dir)
    tokenizer, lora, length = recipe.data.tokenizer, recipe.strategies.lora, recipe.data.max_seq_len
    reading = ReadOptions.of_data(recipe.data)  # eval --data reads as the run did
    if not lora.enabled:
        if not (step / CONFIG).is_file():
            raise CheckpointError(f"{step}: no {CONFIG} (a sharded run's shards need llama-npu merge-checkpoints)")
        return ResolvedWeights(step, step / WEIGHTS, tokenizer=tokenizer, max_seq_len=length, reading=reading,
                               truncation=recipe.data.truncation)
    base = recipe.model.checkpoint
    if not base:
        raise CheckpointError(f"{run_dir}: a LoRA run from random weights (its recipe has no model.checkpoint) "
                              f"saved only adapters, which are not a model without their base")
    base = Path(base)
    if not (base / CONFIG).is_file():
        raise CheckpointError(f"{run_dir}: the base its recipe names, model.checkpoint={base}, has no {CONFIG}")
    return ResolvedWeights(base, base / WEIGHTS, step / WEIGHTS, float(lora.alpha), tokenizer, length, reading,
                           lora.base_dtype == "int8", recipe.data.truncation)


def resolve_weights(path: Path) -> ResolvedWeights:
    """A converted directory, a step directory, or a run directory (its newest complete step)."""
    path = Path(path)
    if (path / STORED_RECIPE).is_file():
        return _from_run(path, _newest_step(path, verify=True))
    if path.parent.name == "checkpoints" and (path.parent.parent / STORED_RECIPE).is_file():
        reason = problem(path)
        if reason is not None:
            raise CheckpointError(f"{path} is not a complete checkpoint ({reason})")
        return _from_run(path.parent.parent, path)
    if (path / CONFIG).is_file():
        return ResolvedWeights(path, path / WEIGHTS)
    raise CheckpointError(f"{path}: not a converted checkpoint, a run directory or a step directory "
                          f"(no {CONFIG} or {STORED_RECIPE})")


def fold_adapters(weights: dict, adapters_path: Path, alpha: float) -> dict:
    """`weights` with W + (alpha / rank) B A for every adapter pair in `adapters_path`."""
    import mindspore as ms  # imported here: validate's header check (check_pretrained) needs no MindSpore

    adapters = read_adapters(adapters_path)
    targets = [name[: -len(LORA_A)] + "weight" for name in adapters if name.endswith(LORA_A)]
    if not targets:
        raise CheckpointError(f"{adapters_path}: no LoRA adapters ({LORA_A}) to merge")
    folded = {}
    for target in targets:
        if target not in weights:
            raise CheckpointError(f"{adapters_path}: adapter of {target}, which the base weights lack")
        b, a = lora_factors(adapters, target, alpha)
        folded[target] = ms.Tensor(weights[target].astype(ms.float32).asnumpy() + b @ a)
    return dict(weights, **folded)


def model_weights(resolved: ResolvedWeights, keep_int8: bool = False) -> tuple[LlamaShape, dict, dict]:
    """(shape, config.json contents, name -> Tensor of the whole model, adapters folded; a
    quantized model's int8 weights and scales as stored with `keep_int8` and no adapters).
    Every file is verified (common/checksums.py) before a byte of it is used."""
    verify_read(resolved.files())
    shape, meta = read_checkpoint_dir(resolved.base)
    weights = read_weights(resolved.weights, meta, keep_int8 and resolved.adapters is None)
    if resolved.base_int8 and not meta.get("quantization"):  # the float base the run held as int8
        weights = {k: ms_tensor(int8_rounded(v.asnumpy())) if LINEAR.match(k) else v for k, v in weights.items()}
    if resolved.adapters is not None:
        weights = fold_adapters(weights, resolved.adapters, resolved.alpha)
    return shape, meta, weights
