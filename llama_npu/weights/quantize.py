"""`llama-npu quantize`: INT8 weight-only quantization of a converted checkpoint.

Per-output-channel symmetric: each row of a decoder linear weight (wq wk wv wo w1 w2 w3)
becomes int8 values q = round(w / s) with s = max|row| / 127, stored with its fp32 scale s;
the embedding (tied to the LM head) and the norms are stored in fp16, as the planner's INT8
inference figures assume (docs/memory.md). `eval` and `generate`
load a quantized directory by dequantizing (q x s) into the model: that measures the
accuracy cost exactly, while the memory saving is the stored size the command reports
(a runtime with int8 matmuls would keep it in device memory too).
"""
from __future__ import annotations

import json
from pathlib import Path

import mindspore as ms
import numpy as np

from ..common.checksums import write_manifest
from ..common.atomic import check_writable, staged_directory
from .pretrained import model_weights, resolve_weights
from .tensor_files import CONFIG, INT8_SCALE, LINEAR, WEIGHTS, ConvertError, quantize_rows



def quantize_checkpoint(src: Path, dst: Path) -> dict:
    src, dst = Path(src), Path(dst)
    if dst.exists():
        raise ConvertError(f"{dst} exists; remove it or choose another --dst")
    check_writable(dst, "--dst")
    source = resolve_weights(src)
    _, meta, weights = model_weights(source)
    if meta.get("quantization") and source.adapters is None:
        raise ConvertError(f"{src} is already quantized")
    loaded = {k: v.asnumpy() for k, v in weights.items()}
    before = sum(v.nbytes for v in loaded.values())
    params, after, layers = [], 0, 0
    for name, value in loaded.items():
        if LINEAR.match(name):
            q, scale = quantize_rows(value.astype(np.float32))
            params += [{"name": name, "data": ms.Tensor(q)}, {"name": name + INT8_SCALE, "data": ms.Tensor(scale)}]
            after += q.nbytes + scale.nbytes
            layers += 1
        else:
            kept = value.astype(np.float16)
            params.append({"name": name, "data": ms.Tensor(kept)})
            after += kept.nbytes
    if not layers:
        raise ConvertError(f"{source.weights}: no decoder linear weights to quantize")
    with staged_directory(dst) as staging:
        ms.save_checkpoint(params, str(staging / WEIGHTS), crc_check=True)
        meta = dict(meta, quantization={"scheme": "int8 weight-only, per-output-channel symmetric, fp32 scales; "
                                                  "embedding and norms fp16",
                                        "linear_layers": layers, "bytes_before": before, "bytes_after": after})
        (staging / CONFIG).write_text(json.dumps(meta, indent=2), encoding="utf-8")
        write_manifest(staging, f"llama-npu quantize --checkpoint {src} --dst {dst}")
    return meta["quantization"]
