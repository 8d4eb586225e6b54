"""`llama-npu convert hf-to-ms | ms-to-hf`: Hugging Face Llama 3.2 weights to a checkpoint
recipes start from (model.checkpoint), and back to safetensors for serving.

A converted directory holds `model.ckpt` (MindSpore, MindFormers' parameter names) and
`config.json` (our model description plus the Hugging Face config it came from). Both
directions stream (weights/tensor_files.py): one tensor of the source is memory-mapped at a
time and written out in row blocks, so the peak is about the largest tensor (the
embedding) whatever the model's size, and neither imports MindSpore.

Lossless conversions: a float32 checkpoint holds any source exactly; --dtype bfloat16 is
exact for Hugging Face's bf16 weights (Llama 3.2's are), float16 for fp16 ones. ms-to-hf
writes the dtype weights/export_dtype.py picks unless --dtype says otherwise.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Dict

import numpy as np

from ..common.checksums import MANIFEST, write_manifest
from ..checkpoints.files import verify_read
from ..common.atomic import check_writable, staged_directory
from ..common.console import note, tracked_items
from ..data.tokenizer import default_tokenizer_path
from ..model.architecture import VOCAB_SIZE, LlamaShape, shape_problem
from ..model.llama import MAX_POSITIONS, RMS_NORM_EPS, ROPE_SCALING, ROPE_THETA
from .export_dtype import export_dtype
from .hf_export import write_model_files
from .pretrained import (ResolvedWeights, checkpoint_tensors, json_object, read_adapters, read_checkpoint_dir,
                         resolve_weights, verify_tensors)
from .tensor_files import (CODES, CONFIG, HF_WEIGHTS, INT8_SCALE, LINEAR, LORA_A, WEIGHTS, CkptWriter, ConvertError,
                           SafetensorsWriter, StoredTensor, dequantize_rows, expected_shapes, from_float32,
                           int8_rounded, lora_factors, rename, row_blocks, safetensors_index, to_float32)


# ---------------------------------------------------------------- Hugging Face side

# LlamaShape's fields as a Hugging Face config.json names them.
HF_KEYS = {"hidden_size": "hidden_size", "num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
           "num_kv_heads": "num_key_value_heads", "intermediate_size": "intermediate_size", "vocab_size": "vocab_size"}


def _equals(value, expected) -> bool:
    """A config.json number equal to `expected` (a string or a list is no number)."""
    return type(value) in (int, float) and float(value) == float(expected)


def read_hf_config(src: Path) -> tuple[LlamaShape, dict]:
    path = src / CONFIG
    if not path.is_file():
        raise ConvertError(f"{src}: no {CONFIG}; expected a Hugging Face Llama 3.2 directory")
    config = json_object(path)
    if config.get("model_type") != "llama":
        raise ConvertError(f"{path}: model_type is {config.get('model_type')!r}, expected 'llama'")
    if not config.get("tie_word_embeddings", False):
        raise ConvertError(f"{path}: tie_word_embeddings is false; Llama 3.2 1B/3B tie the LM head to the embedding")
    scaling = config.get("rope_scaling") or {}
    if not isinstance(scaling, dict) or scaling.get("rope_type", scaling.get("type")) != "llama3":
        raise ConvertError(f"{path}: rope_scaling must be of rope_type 'llama3' (Llama 3.2), got {scaling!r}")
    for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        if not _equals(scaling.get(key), ROPE_SCALING[key]):
            raise ConvertError(f"{path}: rope_scaling.{key}={scaling.get(key)}, the harness builds Llama 3.2's "
                               f"{ROPE_SCALING[key]}")
    if not _equals(config.get("rope_theta"), ROPE_THETA):
        raise ConvertError(f"{path}: rope_theta={config.get('rope_theta')}, expected {ROPE_THETA}")
    if config.get("vocab_size") != VOCAB_SIZE:
        raise ConvertError(f"{path}: vocab_size={config.get('vocab_size')!r}; the Llama 3.2 tokenizer needs {VOCAB_SIZE}")
    values = {name: config.get(key) for name, key in HF_KEYS.items()}
    values["num_kv_heads"] = config.get("num_key_value_heads", values["num_heads"])
    problem = shape_problem(values, HF_KEYS)
    if problem:
        raise ConvertError(f"{path}: {problem}")
    return LlamaShape(**values), config


def check_tokenizer(src: Path) -> None:
    """A tokenizer.json shipped with the weights must map tokens to ids as Llama 3.2's does:
    the harness tokenizes with that one (data.tokenizer)."""
    path = src / "tokenizer.json"
    if not path.is_file():
        return
    theirs = json_object(path).get("model")
    ours = json.loads(default_tokenizer_path().read_text(encoding="utf-8"))
    vocab_theirs, vocab_ours = theirs.get("vocab", {}) if isinstance(theirs, dict) else {}, ours["model"]["vocab"]
    vocab_theirs = vocab_theirs if isinstance(vocab_theirs, dict) else {}
    if vocab_theirs != vocab_ours:
        differing = next((t for t in vocab_ours if vocab_theirs.get(t) != vocab_ours[t]), None)
        raise ConvertError(f"{path}: not the Llama 3.2 tokenizer (token {differing!r} maps to "
                           f"{vocab_theirs.get(differing)}, Llama 3.2 has {vocab_ours.get(differing)})")


def hf_tensors(src: Path) -> Dict[str, StoredTensor]:
    """name -> where it is, over the directory's safetensors shards (headers only)."""
    index = src / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json_object(index).get("weight_map")
        shards = list(weight_map.values()) if isinstance(weight_map, dict) else []
        # shard names are files of this directory: "../x" or "/x" would read another one
        if not shards or not all(isinstance(s, str) and s and Path(s).name == s for s in shards):
            raise ConvertError(f"{index}: weight_map must map each tensor to a shard file of {src}, got "
                               f"{str(weight_map)[:200]}")
        shards = sorted(set(shards))
    elif (src / HF_WEIGHTS).is_file():
        shards = [HF_WEIGHTS]
    else:
        raise ConvertError(f"{src}: no {HF_WEIGHTS} or model.safetensors.index.json")
    tensors = {}
    for shard in shards:
        if not (src / shard).is_file():
            raise ConvertError(f"{src / shard}: shard listed in the index is missing")
        tensors.update(safetensors_index(src / shard))
    tensors.pop("lm_head.weight", None)  # tied: the embedding is the head
    return tensors


def hf_config(shape: LlamaShape, dtype: str, original: dict | None = None) -> dict:
    config = dict(original or {})
    config.update({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": shape.hidden_size,
        "num_hidden_layers": shape.num_layers, "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads, "intermediate_size": shape.intermediate_size,
        "vocab_size": shape.vocab_size, "head_dim": shape.head_dim, "hidden_act": "silu",
        "max_position_embeddings": config.get("max_position_embeddings", MAX_POSITIONS),
        "rms_norm_eps": config.get("rms_norm_eps", RMS_NORM_EPS), "rope_theta": ROPE_THETA,
        "rope_scaling": {"rope_type": "llama3", **ROPE_SCALING}, "tie_word_embeddings": True,
        "bos_token_id": 128000, "eos_token_id": config.get("eos_token_id", [128001, 128008, 128009]),
        "attention_bias": False, "mlp_bias": False, "torch_dtype": dtype})
    return config


# ---------------------------------------------------------------- conversions

def _export_source(src: Path, weights: Path | None, merge_lora: bool):
    if merge_lora:
        if weights is None:
            raise ConvertError("--merge-lora needs --weights: the LoRA run's step_<N>/model.ckpt")
        run = resolve_weights(Path(weights).parent)  # the step's run recipe: alpha, tokenizer
        if run.adapters is None:
            raise ConvertError(f"{weights}: not a step of a LoRA run (its recipe has strategies.lora.enabled false)")
        return dataclasses.replace(run, base=src, weights=src / WEIGHTS)  # src's base, the run's adapters
    if weights is not None:
        return ResolvedWeights(src, Path(weights))
    return resolve_weights(src)


def _converted_blocks(stored: StoredTensor, code: str):
    """`stored` in dtype `code`, one row block at a time."""
    array = stored.read()
    for rows in row_blocks(array):
        yield from_float32(to_float32(array[rows], stored.code), code)


def checked_hf_model(src: Path) -> tuple[LlamaShape, dict, Dict[str, StoredTensor]]:
    """(shape, config, name -> tensor) of a Hugging Face Llama 3.2 directory whose config,
    tokenizer and every tensor header agree; nothing is read beyond the headers (but an
    export of ours, whose checksums.json is verified first)."""
    if (src / MANIFEST).is_file():
        verify_read([path for path in src.iterdir() if path.is_file() and path.name != MANIFEST])
    shape, config = read_hf_config(src)
    check_tokenizer(src)
    tensors = hf_tensors(src)
    expected = expected_shapes(shape)
    missing = [name for name in expected if name not in tensors]
    if missing:
        raise ConvertError(f"{src}: tensor {missing[0]} is missing ({len(missing)} missing in all)")
    for name, stored in tensors.items():
        if name not in expected:
            raise ConvertError(f"{src}: tensor {name!r} is not part of a Llama 3.2 model")
        if stored.shape != expected[name]:
            raise ConvertError(f"{src}: tensor {name} has shape {stored.shape}, but {CONFIG} implies "
                               f"{expected[name]}")
    return shape, config, tensors


def hf_to_ms(src: Path, dst: Path, dtype: str = "float32") -> Path:
    src, dst = Path(src), Path(dst)
    if dst.exists():
        raise ConvertError(f"{dst} exists; remove it or choose another --dst")
    check_writable(dst, "--dst")
    shape, config, tensors = checked_hf_model(src)  # every problem the headers show, before writing
    expected = expected_shapes(shape)
    note(f"writing {dst / WEIGHTS} ({dtype}) from {src}, one tensor at a time")
    with staged_directory(dst) as staging:
        writer = CkptWriter(staging / WEIGHTS)
        for name, dims in tracked_items(expected, "convert"):
            writer.write(rename(name, to_ms=True), CODES[dtype], dims, _converted_blocks(tensors[name], CODES[dtype]))
        crc = writer.close()
        meta = {"format": "llama-npu", "shape": shape.__dict__, "dtype": dtype, "source": str(src),
                "source_dtypes": sorted({t.code for t in tensors.values()}), "hf_config": config}
        (staging / CONFIG).write_text(json.dumps(meta, indent=2), encoding="utf-8")
        write_manifest(staging, f"llama-npu convert hf-to-ms --src {src} --dst {dst} --dtype {dtype}", {WEIGHTS: crc})
    return dst


def _exported_blocks(stored: Dict[str, StoredTensor], name: str, code: str, adapters: dict, alpha: float,
                     int8_cost: dict = None):
    """MindFormers tensor `name` as Hugging Face stores it in dtype `code`, one row block at
    a time: dequantized (int8 x scale) and with its LoRA adapters folded in, if it has them.
    With `int8_cost` (a LoRA run over an int8 base formed from a float checkpoint) a decoder
    linear weight is first rounded as the run held it (q x s), and int8_cost["max_abs"] keeps
    the largest |W - q x s|: what the int8 base costs the exported model."""
    tensor = stored[name]
    array = tensor.read()
    scale = stored[name + INT8_SCALE].read() if name + INT8_SCALE in stored else None
    factors = lora_factors(adapters, name, alpha)
    for rows in row_blocks(array):
        values = dequantize_rows(array[rows], scale[rows]) if scale is not None else to_float32(array[rows],
                                                                                                tensor.code)
        if int8_cost is not None and scale is None and LINEAR.match(name):
            rounded = int8_rounded(values)
            int8_cost["max_abs"] = max(int8_cost["max_abs"], float(np.abs(values - rounded).max()))
            values = rounded
        if factors is not None:
            values = values + factors[0][rows] @ factors[1]
        yield from_float32(values, code)


def ms_to_hf(src: Path, dst: Path, weights: Path | None = None, dtype: str | None = None,
             merge_lora: bool = False) -> Path:
    """`src`: a converted directory, a step directory or a run directory (a LoRA run's
    adapters are folded into the base its recipe names); `weights`: a model.ckpt to export
    instead of src's own (for example a fine-tuned step's). With `merge_lora`, `weights`
    holds a LoRA run's adapters, folded into src's base weights. The export carries the
    tokenizer files with a Llama 3 chat template and its stop tokens (hf_export_files), so
    transformers loads model and tokenizer from it and chats as the run was trained to."""
    src, dst = Path(src), Path(dst)
    if dst.exists():
        raise ConvertError(f"{dst} exists; remove it or choose another --dst")
    check_writable(dst, "--dst")
    source = _export_source(src, weights, merge_lora)
    verify_read(source.files())
    shape, meta = read_checkpoint_dir(source.base)
    dtype, why = export_dtype(dtype, meta, source.adapters or source.weights)
    stored = checkpoint_tensors(source.weights)
    if not merge_lora and any(name.endswith(LORA_A) for name in stored):
        raise ConvertError(f"{source.weights}: holds LoRA adapters, not a whole model; pass --merge-lora with "
                           f"--src the base they were trained on (or --src the run directory)")
    verify_tensors({name: tensor.shape for name, tensor in stored.items()}, shape, source.weights)
    adapters = read_adapters(source.adapters) if source.adapters is not None else {}
    hf_shapes = expected_shapes(shape)
    int8_cost = {"max_abs": 0.0} if source.base_int8 else None
    with staged_directory(dst) as staging:
        note(f"writing {dst / HF_WEIGHTS} in {dtype} ({why}), one tensor at a time")
        writer = SafetensorsWriter(staging / HF_WEIGHTS, [(name, CODES[dtype], dims) for name, dims in hf_shapes.items()])
        for hf_name, _ in tracked_items(hf_shapes, "convert"):
            writer.write(hf_name, _exported_blocks(stored, rename(hf_name, to_ms=True), CODES[dtype], adapters,
                                                   source.alpha, int8_cost))
        writer.close()
        write_model_files(staging, hf_config(shape, dtype, meta.get("hf_config")), source.tokenizer)
        write_manifest(staging, f"llama-npu convert ms-to-hf --src {src} --dst {dst}")
    if int8_cost is not None and meta.get("quantization"):
        note("int8 base (strategies.lora.base_dtype): the adapters are folded into the quantized base's q x s")
    elif int8_cost is not None:
        note(f"int8 base (strategies.lora.base_dtype): the adapters are folded into the float base rounded to "
             f"int8 (q x s), as the run held it; its accuracy cost, max |W - q x s| over the decoder linear "
             f"weights: {int8_cost['max_abs']:.3g}")
    return dst
