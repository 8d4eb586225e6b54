"""Hugging Face Llama 3.2 weights <-> MindSpore checkpoints.

A converted directory holds `model.ckpt` (MindSpore, MindFormers' parameter names) and
`config.json` (our model description plus the Hugging Face config it came from). Recipes
name it as `model.checkpoint`. The renaming is the one FACTS.md checked against
`transformers` to 7.5e-8 on the logits; no tensor is permuted. Safetensors are read and
written here directly (an 8-byte header length, a JSON header, raw little-endian data), so
bfloat16 needs no torch and a round trip is bit-exact.
"""
from __future__ import annotations

import dataclasses
import json
import re
import struct
from pathlib import Path
from typing import Dict

import numpy as np

from .atomic import staged_directory
from .console import note, tracked_items
from .architecture import VOCAB_SIZE, LlamaShape
from .model import MAX_POSITIONS, RMS_NORM_EPS, ROPE_SCALING, ROPE_THETA

CONFIG = "config.json"
WEIGHTS = "model.ckpt"

# Hugging Face name pattern -> MindFormers name pattern ({i}: layer index).
RENAMES = [
    ("model.embed_tokens.weight", "model.tok_embeddings.embedding_weight"),
    ("model.norm.weight", "model.norm_out.weight"),
    ("model.layers.{i}.self_attn.q_proj.weight", "model.layers.{i}.attention.wq.weight"),
    ("model.layers.{i}.self_attn.k_proj.weight", "model.layers.{i}.attention.wk.weight"),
    ("model.layers.{i}.self_attn.v_proj.weight", "model.layers.{i}.attention.wv.weight"),
    ("model.layers.{i}.self_attn.o_proj.weight", "model.layers.{i}.attention.wo.weight"),
    ("model.layers.{i}.mlp.gate_proj.weight", "model.layers.{i}.feed_forward.w1.weight"),
    ("model.layers.{i}.mlp.up_proj.weight", "model.layers.{i}.feed_forward.w3.weight"),
    ("model.layers.{i}.mlp.down_proj.weight", "model.layers.{i}.feed_forward.w2.weight"),
    ("model.layers.{i}.input_layernorm.weight", "model.layers.{i}.attention_norm.weight"),
    ("model.layers.{i}.post_attention_layernorm.weight", "model.layers.{i}.ffn_norm.weight"),
]


class ConvertError(ValueError):
    """Bad conversion input; the message names the file and the tensor."""


def _pattern(template: str) -> re.Pattern:
    return re.compile("^" + re.escape(template).replace(re.escape("{i}"), r"(\d+)") + "$")


def rename(name: str, to_ms: bool) -> str:
    for hf, ms in RENAMES:
        source, target = (hf, ms) if to_ms else (ms, hf)
        match = _pattern(source).match(name)
        if match:
            return target.replace("{i}", match.group(1)) if match.groups() else target
    raise ConvertError(f"tensor {name!r} is not part of a Llama 3.2 model")


def expected_shapes(shape: LlamaShape) -> Dict[str, tuple]:
    """Hugging Face tensor name -> shape, for a tied-embedding Llama 3.2."""
    h, f, kv = shape.hidden_size, shape.intermediate_size, shape.num_kv_heads * shape.head_dim
    out = {"model.embed_tokens.weight": (shape.vocab_size, h), "model.norm.weight": (h,)}
    per_layer = {"self_attn.q_proj.weight": (h, h), "self_attn.k_proj.weight": (kv, h),
                 "self_attn.v_proj.weight": (kv, h), "self_attn.o_proj.weight": (h, h),
                 "mlp.gate_proj.weight": (f, h), "mlp.up_proj.weight": (f, h), "mlp.down_proj.weight": (h, f),
                 "input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,)}
    for i in range(shape.num_layers):
        out.update({f"model.layers.{i}.{k}": v for k, v in per_layer.items()})
    return out


# ---------------------------------------------------------------- safetensors

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}  # BF16 kept as its raw bits


def read_safetensors(path: Path) -> Dict[str, tuple]:
    """name -> (safetensors dtype, numpy array); BF16 arrays hold the raw 16-bit patterns."""
    with open(path, "rb") as fh:
        try:
            (length,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(length))
        except (struct.error, ValueError) as exc:
            raise ConvertError(f"{path}: not a safetensors file ({exc})") from None
        data = fh.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _DTYPES:
            raise ConvertError(f"{path}: tensor {name} has dtype {info['dtype']}; expected F32, F16 or BF16")
        start, end = info["data_offsets"]
        if end > len(data):
            raise ConvertError(f"{path}: tensor {name} runs past the end of the file (truncated?)")
        array = np.frombuffer(data[start:end], dtype=_DTYPES[info["dtype"]]).reshape(info["shape"])
        tensors[name] = (info["dtype"], array)
    return tensors


def write_safetensors(path: Path, tensors: Dict[str, tuple]) -> None:
    header, offset, blobs = {}, 0, []
    for name, (dtype, array) in tensors.items():
        blob = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    header["__metadata__"] = {"format": "pt"}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(encoded)) + encoded)
        for blob in blobs:
            fh.write(blob)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """Round to nearest even, as torch does."""
    bits = values.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


# ---------------------------------------------------------------- Hugging Face side

def read_hf_config(src: Path) -> tuple[LlamaShape, dict]:
    path = src / CONFIG
    if not path.is_file():
        raise ConvertError(f"{src}: no {CONFIG}; expected a Hugging Face Llama 3.2 directory")
    config = json.loads(path.read_text(encoding="utf-8"))
    if config.get("model_type") != "llama":
        raise ConvertError(f"{path}: model_type is {config.get('model_type')!r}, expected 'llama'")
    if not config.get("tie_word_embeddings", False):
        raise ConvertError(f"{path}: tie_word_embeddings is false; Llama 3.2 1B/3B tie the LM head to the embedding")
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type", scaling.get("type")) != "llama3":
        raise ConvertError(f"{path}: rope_scaling must be of rope_type 'llama3' (Llama 3.2), got {scaling!r}")
    for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        if float(scaling.get(key, -1)) != float(ROPE_SCALING[key]):
            raise ConvertError(f"{path}: rope_scaling.{key}={scaling.get(key)}, the harness builds Llama 3.2's "
                               f"{ROPE_SCALING[key]}")
    if float(config.get("rope_theta", 0)) != ROPE_THETA:
        raise ConvertError(f"{path}: rope_theta={config.get('rope_theta')}, expected {ROPE_THETA}")
    shape = LlamaShape(config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
                       config.get("num_key_value_heads", config["num_attention_heads"]),
                       config["intermediate_size"], config["vocab_size"])
    if shape.vocab_size != VOCAB_SIZE:
        raise ConvertError(f"{path}: vocab_size={shape.vocab_size}; the Llama 3.2 tokenizer needs {VOCAB_SIZE}")
    return shape, config


def check_tokenizer(src: Path) -> None:
    """A tokenizer.json shipped with the weights must map tokens to ids as Llama 3.2's does:
    the harness tokenizes with that one (data.tokenizer)."""
    path = src / "tokenizer.json"
    if not path.is_file():
        return
    from .data.tokenizer import default_tokenizer_path

    theirs = json.loads(path.read_text(encoding="utf-8"))
    ours = json.loads(default_tokenizer_path().read_text(encoding="utf-8"))
    vocab_theirs, vocab_ours = theirs.get("model", {}).get("vocab", {}), ours["model"]["vocab"]
    if vocab_theirs != vocab_ours:
        differing = next((t for t in vocab_ours if vocab_theirs.get(t) != vocab_ours[t]), None)
        raise ConvertError(f"{path}: not the Llama 3.2 tokenizer (token {differing!r} maps to "
                           f"{vocab_theirs.get(differing)}, Llama 3.2 has {vocab_ours.get(differing)})")


def read_hf_weights(src: Path) -> Dict[str, tuple]:
    index = src / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (src / "model.safetensors").is_file():
        shards = ["model.safetensors"]
    else:
        raise ConvertError(f"{src}: no model.safetensors or model.safetensors.index.json")
    tensors = {}
    for shard in shards:
        if not (src / shard).is_file():
            raise ConvertError(f"{src / shard}: shard listed in the index is missing")
        tensors.update(read_safetensors(src / shard))
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

def hf_to_ms(src: Path, dst: Path, dtype: str = "float32") -> Path:
    import mindspore as ms

    src, dst = Path(src), Path(dst)
    if dst.exists():
        raise ConvertError(f"{dst} exists; remove it or choose another --dst")
    shape, config = read_hf_config(src)
    check_tokenizer(src)
    note(f"reading weights from {src}")
    tensors = read_hf_weights(src)
    expected = expected_shapes(shape)
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise ConvertError(f"{src}: tensor {missing[0]} is missing ({len(missing)} missing in all)")
    params = []
    for name, (st_dtype, array) in tracked_items(tensors, "convert"):
        if name not in expected:
            raise ConvertError(f"{src}: tensor {name!r} is not part of a Llama 3.2 model")
        if tuple(array.shape) != expected[name]:
            raise ConvertError(f"{src}: tensor {name} has shape {tuple(array.shape)}, but {CONFIG} implies "
                               f"{expected[name]}")
        values = bf16_to_f32(array) if st_dtype == "BF16" else array.astype(np.float32)
        params.append({"name": rename(name, to_ms=True), "data": ms.Tensor(values, dtype=getattr(ms, dtype))})
    with staged_directory(dst) as staging:
        note(f"writing {dst / WEIGHTS}")
        ms.save_checkpoint(params, str(staging / WEIGHTS))
        meta = {"format": "llama-npu", "shape": shape.__dict__, "dtype": dtype, "source": str(src),
                "source_dtypes": sorted({d for d, _ in tensors.values()}), "hf_config": config}
        (staging / CONFIG).write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return dst


def read_checkpoint_dir(src: Path) -> tuple[LlamaShape, dict]:
    path = Path(src) / CONFIG
    if not path.is_file():
        raise ConvertError(f"{src}: no {CONFIG}; expected a directory written by llama-npu convert hf-to-ms")
    meta = json.loads(path.read_text(encoding="utf-8"))
    if meta.get("format") != "llama-npu":
        raise ConvertError(f"{path}: not a llama-npu checkpoint description")
    return LlamaShape(**meta["shape"]), meta


LORA_A, LORA_B = "mindpet_delta_lora_a", "mindpet_delta_lora_b"


def merge_adapters(base: dict, adapters: dict, alpha: float) -> int:
    """W <- W + (alpha / rank) B A for every adapter pair, in place on `base` (float32 numpy)."""
    merged = 0
    for name in [n for n in adapters if n.endswith(LORA_A)]:
        prefix = name[: -len(LORA_A)]
        a, b = adapters[name], adapters[prefix + LORA_B]  # (r, in), (out, r)
        target = prefix + "weight"
        if target not in base:
            raise ConvertError(f"adapter {name} has no base weight {target}")
        base[target] = base[target] + (alpha / a.shape[0]) * (b @ a)
        merged += 1
    return merged


def _export_source(src: Path, weights: Path | None, merge_lora: bool):
    from .pretrained import ResolvedWeights, resolve_weights

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


def ms_to_hf(src: Path, dst: Path, weights: Path | None = None, dtype: str | None = None,
             merge_lora: bool = False) -> Path:
    """`src`: a converted directory, a step directory or a run directory (a LoRA run's
    adapters are folded into the base its recipe names); `weights`: a model.ckpt to export
    instead of src's own (for example a fine-tuned step's). With `merge_lora`, `weights`
    holds a LoRA run's adapters, folded into src's base weights. The export carries the
    tokenizer files with a Llama 3 chat template and its stop tokens (hf_export_files), so
    transformers loads model and tokenizer from it and chats as the run was trained to."""
    import mindspore as ms

    from .hf_export_files import write_model_files
    from .pretrained import model_weights, verify_tensors

    src, dst = Path(src), Path(dst)
    if dst.exists():
        raise ConvertError(f"{dst} exists; remove it or choose another --dst")
    source = _export_source(src, weights, merge_lora)
    shape, meta, loaded = model_weights(source)
    dtype = dtype or {"BF16": "bfloat16", "F16": "float16"}.get((meta.get("source_dtypes") or ["F32"])[0], "float32")
    verify_tensors({name: tuple(tensor.shape) for name, tensor in loaded.items()}, shape, source.weights)
    tensors = {}
    for hf_name, _ in tracked_items(expected_shapes(shape), "convert"):
        values = loaded[rename(hf_name, to_ms=True)].astype(ms.float32).asnumpy()
        if dtype == "bfloat16":
            tensors[hf_name] = ("BF16", f32_to_bf16(values))
        else:
            tensors[hf_name] = ("F16", values.astype(np.float16)) if dtype == "float16" else ("F32", values)
    with staged_directory(dst) as staging:
        note(f"writing {dst / 'model.safetensors'}")
        write_safetensors(staging / "model.safetensors", tensors)
        write_model_files(staging, hf_config(shape, dtype, meta.get("hf_config")), source.tokenizer)
    return dst
