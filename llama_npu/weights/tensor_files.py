"""The weights on disk: Llama 3.2's tensor names (Hugging Face and MindFormers), their
shapes, and the two files that hold them -- safetensors (Hugging Face) and MindSpore's
.ckpt -- read and written one tensor at a time.

A leaf module (numpy only): the convert commands, the pretrained loader, quantize and the
pre-flight all read the format from here.

Reading maps one tensor of a file at a time (mmap) and writing streams each tensor in
row blocks, so a conversion holds about one tensor, never the model. The .ckpt layout is
MindSpore's own (mindspore/train/serialization.py, _write_parameter_data and
_load_into_param_dict; mindspore/train/checkpoint_pb2.py): a sequence of protobuf
Checkpoint messages of one Value{tag = 1, tensor = 2} each, TensorProto{dims = 1 (unpacked
varints), tensor_type = 2, tensor_content = 3}; a tensor over SLICE_BYTES is several
records of one tag, which the loader joins; an optional trailer b"crc_num" + a 10-byte
big-endian CRC32 of everything before it.
"""
from __future__ import annotations

import binascii
import json
import math
import mmap
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import numpy as np

from .errors import ConvertError

CONFIG = "config.json"  # a converted directory's description (and a Hugging Face directory's config)
WEIGHTS = "model.ckpt"
HF_WEIGHTS = "model.safetensors"
LORA_A, LORA_B = "mindpet_delta_lora_a", "mindpet_delta_lora_b"
INT8_SCALE = ".int8_scale"  # quantize: a linear weight's per-row fp32 scale, stored beside it
# The decoder linear weights quantize turns to int8 (and an int8 base holds as int8).
LINEAR = re.compile(r"^model\.layers\.\d+\.(attention\.w[qkvo]|feed_forward\.w[123])\.weight$")


# ---------------------------------------------------------------- names and shapes

# Hugging Face name pattern -> MindFormers name pattern ({i}: layer index); FACTS.md checked
# this renaming against transformers to 7.5e-8 on the logits, with no tensor permuted.
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


def _pattern(template: str) -> re.Pattern:
    return re.compile("^" + re.escape(template).replace(re.escape("{i}"), r"(\d+)") + "$")


def rename(name: str, to_ms: bool) -> str:
    for hf, ms in RENAMES:
        source, target = (hf, ms) if to_ms else (ms, hf)
        match = _pattern(source).match(name)
        if match:
            return target.replace("{i}", match.group(1)) if match.groups() else target
    raise ConvertError(f"tensor {name!r} is not part of a Llama 3.2 model")


def expected_shapes(shape) -> Dict[str, tuple]:
    """Hugging Face tensor name -> shape, for a tied-embedding Llama 3.2 of `shape` (a
    model.LlamaShape: hidden_size, num_layers, num_kv_heads, head_dim, ...)."""
    h, f, kv = shape.hidden_size, shape.intermediate_size, shape.num_kv_heads * shape.head_dim
    out = {"model.embed_tokens.weight": (shape.vocab_size, h), "model.norm.weight": (h,)}
    per_layer = {"self_attn.q_proj.weight": (h, h), "self_attn.k_proj.weight": (kv, h),
                 "self_attn.v_proj.weight": (kv, h), "self_attn.o_proj.weight": (h, h),
                 "mlp.gate_proj.weight": (f, h), "mlp.up_proj.weight": (f, h), "mlp.down_proj.weight": (h, f),
                 "input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,)}
    for i in range(shape.num_layers):
        out.update({f"model.layers.{i}.{k}": v for k, v in per_layer.items()})
    return out


# ---------------------------------------------------------------- dtypes

# Safetensors' dtype codes name dtypes here; BF16 arrays hold the raw 16-bit patterns
# (numpy has no bfloat16), so bfloat16 needs no torch and round trips are bit-exact.
# I32: the optimizer's global_step, which a resume of the host optimizer streams (checkpoints/files.py).
NUMPY = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I8": np.int8, "I32": np.int32}
CKPT_TYPES = {"F32": "Float32", "F16": "Float16", "BF16": "BFloat16", "I8": "Int8", "I32": "Int32"}  # TensorProto.tensor_type
CODES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}  # --dtype -> code


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """Round to nearest even, as torch does."""
    bits = values.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def to_float32(values: np.ndarray, code: str) -> np.ndarray:
    return bf16_to_f32(values) if code == "BF16" else values.astype(np.float32)


def from_float32(values: np.ndarray, code: str) -> np.ndarray:
    return f32_to_bf16(values) if code == "BF16" else values.astype(NUMPY[code])


# ---------------------------------------------------------------- one tensor of a file

MAX_HEADER_BYTES = 100_000_000  # the safetensors format's own limit on its JSON header


def _whole_numbers(value) -> bool:
    return isinstance(value, list) and all(type(v) is int and v >= 0 for v in value)


@dataclass
class StoredTensor:
    """Where one tensor's bytes are: (offset, length) pieces of `path`, in order."""
    path: Path
    name: str
    code: str
    shape: tuple
    pieces: List[Tuple[int, int]] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(length for _, length in self.pieces)

    def check_size(self) -> None:
        """Its shape and dtype agree with the bytes stored (which lie within the file), or one
        line: a header's shape is never trusted for an allocation on its own."""
        if self.code not in NUMPY:  # a type no weight of ours has: never read (read() refuses it)
            return
        expected = np.dtype(NUMPY[self.code]).itemsize * math.prod(self.shape)
        if expected != self.nbytes:
            raise ConvertError(f"{self.path}: tensor {self.name} ({self.code}, shape {self.shape}) should hold "
                               f"{expected:,} bytes, the file holds {self.nbytes:,} for it")

    def read(self) -> np.ndarray:
        """The tensor (index readers checked its size: check_size), memory-mapped read-only (a copy only when it is in several pieces);
        its pages are released when the array is dropped."""
        arrays = []
        with open(self.path, "rb") as fh:
            for offset, length in self.pieces:
                start = offset - offset % mmap.ALLOCATIONGRANULARITY
                if length == 0:
                    arrays.append(np.zeros(0, NUMPY[self.code]))
                    continue
                mapped = mmap.mmap(fh.fileno(), length + offset - start, access=mmap.ACCESS_READ, offset=start)
                arrays.append(np.frombuffer(mapped, NUMPY[self.code], length // np.dtype(NUMPY[self.code]).itemsize,
                                            offset - start))
        flat = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
        return flat.reshape(self.shape)


def safetensors_index(path: Path) -> Dict[str, StoredTensor]:
    """name -> StoredTensor of a safetensors file, from its header alone (an 8-byte
    little-endian header length, a JSON header, then the raw data)."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as fh:
        try:
            (length,) = struct.unpack("<Q", fh.read(8))
            if length > min(size - 8, MAX_HEADER_BYTES):  # checked before the header is read into memory
                raise ValueError(f"its header claims {length:,} bytes of a {size:,}-byte file")
            header = json.loads(fh.read(length))
            if not isinstance(header, dict):
                raise ValueError("its header is not a JSON object")
        except (struct.error, ValueError, RecursionError) as exc:  # RecursionError: a header nested thousands deep
            raise ConvertError(f"{path}: not a safetensors file ({exc})") from None
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        info = info if isinstance(info, dict) else {}
        if not isinstance(info.get("dtype"), str) or info["dtype"] not in NUMPY or info["dtype"] == "I8":
            raise ConvertError(f"{path}: tensor {name} has dtype {info.get('dtype')!r}; expected F32, F16 or BF16")
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if not (_whole_numbers(shape) and _whole_numbers(offsets) and len(offsets) == 2 and offsets[0] <= offsets[1]):
            raise ConvertError(f"{path}: tensor {name} has shape {shape!r} and data_offsets {offsets!r}; expected "
                               f"lists of whole numbers, the offsets [start, end]")
        start, end = offsets
        if 8 + length + end > size:
            raise ConvertError(f"{path}: tensor {name} runs past the end of the file (truncated?)")
        tensors[name] = StoredTensor(path, name, info["dtype"], tuple(shape), [(8 + length + start, end - start)])
        tensors[name].check_size()
    return tensors


def read_safetensors(path: Path) -> Dict[str, tuple]:
    """name -> (dtype code, array) of every tensor of a (small) safetensors file."""
    return {name: (t.code, t.read()) for name, t in safetensors_index(path).items()}


class SafetensorsWriter:
    """A safetensors file written tensor by tensor: the header (every name, dtype and shape)
    first, then each tensor's bytes in the header's order, in as many blocks as given."""

    def __init__(self, path: Path, tensors: List[Tuple[str, str, tuple]]):
        header, offset = {}, 0
        self.order = [name for name, _, _ in tensors]
        self.sizes = {}
        for name, code, shape in tensors:
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(NUMPY[code]).itemsize
            header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            self.sizes[name] = nbytes
            offset += nbytes
        header["__metadata__"] = {"format": "pt"}
        encoded = json.dumps(header, separators=(",", ":")).encode()
        encoded += b" " * (-len(encoded) % 8)
        self.fh = open(path, "wb")
        self.fh.write(struct.pack("<Q", len(encoded)) + encoded)

    def write(self, name: str, blocks) -> None:
        assert name == self.order.pop(0), f"{name} written out of the header's order"
        written = 0
        for block in blocks:
            written += self.fh.write(np.ascontiguousarray(block).tobytes())
        if written != self.sizes[name]:
            raise ConvertError(f"{name}: {written} bytes written, its header says {self.sizes[name]}")

    def close(self) -> None:
        self.fh.close()


# ---------------------------------------------------------------- MindSpore .ckpt

SLICE_BYTES = 512 * 1024 * 1024  # MindSpore's SLICE_SIZE (512 * 1024 KB): the largest record it writes


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _read_varint(fh) -> int:
    shift = result = 0
    while shift < 64:  # protobuf's varints are at most 10 bytes
        byte = fh.read(1)
        if not byte:
            raise EOFError("truncated")
        result |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return result
        shift += 7
    raise ValueError("malformed varint")


def ckpt_index(path: Path) -> Dict[str, StoredTensor]:
    """name -> StoredTensor of a MindSpore .ckpt, reading the record headers and seeking
    past the tensor data. Raises ValueError (or EOFError) on a file that is not one."""
    path = Path(path)
    codes = {ckpt: code for code, ckpt in CKPT_TYPES.items()}
    size = path.stat().st_size
    tensors: Dict[str, StoredTensor] = {}
    with open(path, "rb") as fh:
        fh.seek(max(size - 17, 0))
        end = size - 17 if fh.read(7) == b"crc_num" else size
        fh.seek(0)
        while fh.tell() < end:
            if _read_varint(fh) != 0x0A:  # Checkpoint.value
                raise ValueError("unexpected record")
            value_end = _read_varint(fh) + fh.tell()
            if value_end > end:  # every length is checked against the file before anything is read by it
                raise ValueError("a record runs past the end of the file (truncated?)")
            name, dims, kind, piece = None, [], "", None
            while fh.tell() < value_end:
                key, length = _read_varint(fh), _read_varint(fh)
                if fh.tell() + length > value_end:
                    raise ValueError("malformed record")
                if key == 0x0A:  # Value.tag
                    name = fh.read(length).decode()
                elif key == 0x12:  # Value.tensor
                    tensor_end = fh.tell() + length
                    while fh.tell() < tensor_end:
                        inner = _read_varint(fh)
                        if inner == 0x08:  # dims
                            dims.append(_read_varint(fh))
                            continue
                        inner_length = _read_varint(fh)
                        if fh.tell() + inner_length > tensor_end:
                            raise ValueError("malformed record")
                        if inner == 0x12:  # tensor_type
                            kind = fh.read(inner_length).decode()
                        else:  # tensor_content: where it is, not what
                            piece = (fh.tell(), inner_length)
                            fh.seek(inner_length, 1)
                else:
                    fh.seek(length, 1)
            if name is None or fh.tell() != value_end:
                raise ValueError("malformed record")
            stored = tensors.get(name)
            if stored is None:
                stored = tensors[name] = StoredTensor(path, name, codes.get(kind, kind), tuple(dims))
            if piece is not None:
                stored.pieces.append(piece)
    for stored in tensors.values():
        stored.check_size()
    return tensors


class CkptWriter:
    """A .ckpt that MindSpore's load_checkpoint reads, written tensor by tensor, each in
    records of at most SLICE_BYTES as MindSpore splits them, with the CRC trailer that
    load_checkpoint(crc_check=True) verifies."""

    def __init__(self, path: Path):
        self.fh = open(path, "wb")
        self.crc = 0

    def _out(self, data: bytes) -> None:
        self.crc = binascii.crc32(data, self.crc)
        self.fh.write(data)

    def write(self, name: str, code: str, shape: tuple, rows: Iterator[np.ndarray]) -> None:
        """`rows`: the tensor as consecutive row blocks (of its first dimension) in dtype
        `code`; blocks are grouped into records of at most SLICE_BYTES."""
        tag = name.encode()
        kind = CKPT_TYPES[code].encode()
        dims = b"".join(b"\x08" + _varint(d) for d in shape)
        pending, pending_bytes = [], 0

        def flush():
            content = sum(b.nbytes for b in pending)
            tensor = dims + b"\x12" + _varint(len(kind)) + kind + b"\x1a" + _varint(content)
            tensor_length = len(tensor) + content
            value = b"\x0a" + _varint(len(tag)) + tag + b"\x12" + _varint(tensor_length)
            self._out(b"\x0a" + _varint(len(value) + tensor_length) + value + tensor)
            for block in pending:
                self._out(np.ascontiguousarray(block).tobytes())

        for block in rows:
            if pending and pending_bytes + block.nbytes > SLICE_BYTES:
                flush()
                pending, pending_bytes = [], 0
            pending.append(block)
            pending_bytes += block.nbytes
        flush()

    def close(self) -> int:
        """Write the trailer; return the CRC-32 of the whole file (checksums.json's)."""
        trailer = b"crc_num" + self.crc.to_bytes(10, byteorder="big")
        self.fh.write(trailer)
        self.fh.close()
        return binascii.crc32(trailer, self.crc)


def row_blocks(array: np.ndarray, block_bytes: int = 64 * 1024 * 1024) -> Iterator[slice]:
    """Slices of `array`'s first dimension of about `block_bytes` each (a 1-d array: one)."""
    if array.ndim < 2:
        yield slice(None)
        return
    rows = max(1, block_bytes // max(1, array[0].nbytes))
    for start in range(0, array.shape[0], rows):
        yield slice(start, start + rows)


# ---------------------------------------------------------------- quantized and LoRA tensors

def quantize_rows(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """quantize's scheme: each row as int8 q = round(w / s), s = max|row| / 127 (fp32)."""
    scale = np.abs(weight).max(axis=1) / 127.0
    scale = np.where(scale == 0, 1.0, scale).astype(np.float32)
    q = np.clip(np.rint(weight / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale


def int8_rounded(weight: np.ndarray) -> np.ndarray:
    """The float32 weight an int8 base holds for a float `weight`: q x s of quantize_rows."""
    return dequantize_rows(*quantize_rows(weight.astype(np.float32)))


def dequantize_rows(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The float32 weights int8 rows `q` with their per-row `scale` stand for."""
    return q.astype(np.float32) * scale[:, None]


def dequantize(weights: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Float weights from a quantized checkpoint's arrays (scales folded back in)."""
    out = {}
    for name, value in weights.items():
        if name.endswith(INT8_SCALE):
            continue
        scale = weights.get(name + INT8_SCALE)
        out[name] = dequantize_rows(value, scale) if scale is not None else value.astype(np.float32)
    return out


def lora_factors(adapters: Dict[str, np.ndarray], target: str, alpha: float):
    """(alpha / rank) B and A of the adapter pair of weight `target`, so that W + B' A is
    the merged weight (a row block of it: W[rows] + B'[rows] A); None when it has none."""
    prefix = target[: -len("weight")]
    a, b = adapters.get(prefix + LORA_A), adapters.get(prefix + LORA_B)  # (r, in), (out, r)
    if a is None or b is None:
        return None
    return (alpha / a.shape[0]) * b.astype(np.float32), a.astype(np.float32)
