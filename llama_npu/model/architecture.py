"""Llama 3.2's architecture as plain data: the presets' shapes and the decoder's linear
layers.

A leaf: it imports nothing from the package, so recipe validation (recipe/validate.py), the model
builder (model/llama.py), LoRA (strategies/lora.py) and the planner all read one definition.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from typing import Optional

VOCAB_SIZE = 128256

# The size keys a recipe's model section may override on its preset.
SIZE_KEYS = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size")

# The linear layers of MindFormers' Llama decoder layer, by cell name.
LINEAR_LAYERS = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")


@dataclass(frozen=True)
class LlamaShape:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int = VOCAB_SIZE

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def describe(self) -> str:
        return (f"hidden {self.hidden_size}, {self.num_layers} layers, {self.num_heads} heads / "
                f"{self.num_kv_heads} KV heads, MLP {self.intermediate_size}, vocab {self.vocab_size:,}")


PRESETS = {
    "llama3.2-1b": LlamaShape(2048, 16, 32, 8, 8192),
    "llama3.2-3b": LlamaShape(3072, 28, 24, 8, 8192),
    # Same architecture at a size that trains in seconds on 2 CPU cores; the real tokenizer
    # keeps the full vocabulary, so the logits dominate its cost exactly as they do at 1B.
    "tiny": LlamaShape(64, 2, 4, 2, 128),
}


# Each dimension's largest value among Llama 3.2's models. A file (config.json, a checkpoint's
# description) giving a larger one describes no model the harness builds, and its sizes must
# be refused before anything is allocated from them: 2^40 layers would exhaust the host.
LARGEST = {f.name: max(getattr(p, f.name) for p in PRESETS.values()) for f in fields(LlamaShape)}


def shape_problem(values: dict, keys: Optional[dict] = None) -> Optional[str]:
    """Why `values` (LlamaShape's fields, read from a file) is no Llama 3.2 shape, or None;
    `keys` names each field as the file spells it (config.json's num_hidden_layers)."""
    keys = keys or {}
    for name, largest in LARGEST.items():
        value = values.get(name)
        if type(value) is not int or not 1 <= value <= largest:  # bool is no size either
            return f"{keys.get(name, name)}={value!r}; expected a whole number from 1 to {largest} (Llama 3.2's largest)"
    if values["hidden_size"] % values["num_heads"] or values["num_heads"] % values["num_kv_heads"]:
        return (f"{keys.get('hidden_size', 'hidden_size')}={values['hidden_size']}, {keys.get('num_heads', 'num_heads')}"
                f"={values['num_heads']}, {keys.get('num_kv_heads', 'num_kv_heads')}={values['num_kv_heads']}: the "
                f"heads must divide the hidden size and the KV heads the heads")
    return None


def resolve_shape(section) -> LlamaShape:
    """The preset of a recipe's model section with its size overrides applied (recipe
    validation checks the result)."""
    overrides = {name: getattr(section, name) for name in SIZE_KEYS if getattr(section, name) is not None}
    return replace(PRESETS[section.preset], **overrides)


def matched_layers(target_modules: str) -> list[str]:
    """The decoder linear layers a LoRA target_modules regex selects (MindFormers matches it
    against each cell's own name with re.match)."""
    return [name for name in LINEAR_LAYERS if re.match(target_modules, name)]
