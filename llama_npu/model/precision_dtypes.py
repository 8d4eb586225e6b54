"""The model's dtypes under a precision section (strategies/precision.py owns the section and its
checks): what the network is built in, and what `convert ms-to-hf` says a run computed in
(weights/export_dtype.py). Here, below both, so that weights/ reads it without importing the
strategies, which import weights/ to load the pre-trained model."""
from __future__ import annotations


def model_dtypes(section) -> dict:
    """compute_dtype and param_dtype for model.llama_config, from a precision section's
    amp_level and dtype."""
    if section.amp_level == "O0":
        return {"compute_dtype": "float32", "param_dtype": "float32"}
    if section.amp_level == "O3":
        return {"compute_dtype": section.dtype, "param_dtype": section.dtype}
    return {"compute_dtype": section.dtype, "param_dtype": "float32"}
