"""`llama-npu generate`: a Llama 3 chat reply from a converted checkpoint, a step or a run
directory (LoRA adapters folded into the run's base), streamed.

No KV cache: every new token runs the model over one fixed-length buffer (prompt + the
tokens asked for), so the graph compiles once; the causal mask makes the right padding
irrelevant. Fine for checking a fine-tune on CPU; serving wants an incremental decoder.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, List, Optional

import numpy as np

from ..data.chat_template import encode_chat, role_headers
from ..data.tokenizer import load_tokenizer
from ..model.tokens import PAD_ID
from ..weights.hf_export import STOP_TOKEN_IDS
from .loaded_model import build_from_checkpoint, checkpoint_tokenizer

STOP_IDS = tuple(STOP_TOKEN_IDS)  # the ones an export's generation_config.json names


def prompt_ids(tokenizer, prompt: str, system: Optional[str] = None) -> List[int]:
    """The Llama 3 chat up to and including the assistant header."""

    messages = ([("system", system)] if system else []) + [("user", prompt)]
    ids, _ = encode_chat(tokenizer, messages)
    return ids + role_headers(tokenizer)["assistant"]


def next_token(logits: np.ndarray, greedy: bool, temperature: float, top_p: float, rng) -> int:
    if greedy:
        return int(np.argmax(logits))
    scaled = (logits - logits.max()) / max(temperature, 1e-6)
    probs = np.exp(scaled)
    probs /= probs.sum()
    order = np.argsort(-probs)
    keep = np.cumsum(probs[order]) - probs[order] < top_p  # the smallest set reaching top_p
    chosen = order[keep]
    return int(rng.choice(chosen, p=probs[chosen] / probs[chosen].sum()))


def decode(net, tokenizer, ids: List[int], max_new_tokens: int, greedy: bool = True, temperature: float = 1.0,
           top_p: float = 1.0, seed: int = 0, on_text: Callable[[str], None] = lambda _: None,
           stop: Callable[[str], bool] = lambda _: False) -> List[int]:
    """The token ids `net` generates after `ids` (without the stop token), until a stop token,
    `max_new_tokens` or `stop(text so far)`; `on_text` receives the text as it grows."""
    import mindspore as ms  # imported here: MindSpore loads after the command's quiet_frameworks (common/frameworks.py)
    from mindspore import nn

    class Logits(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.backbone, self.head = net.model, net.lm_head

        def construct(self, tokens, position):
            hidden = self.backbone(tokens)  # (1, L, H)
            return self.head(hidden[0, position]).astype(ms.float32)  # (V,)

    logits_at = Logits()
    logits_at.set_train(False)
    rng = np.random.default_rng(seed)
    length = len(ids) + max_new_tokens
    buffer = np.full((1, length), PAD_ID, dtype=np.int32)
    buffer[0, :len(ids)] = ids
    generated: List[int] = []
    shown = ""
    for position in range(len(ids) - 1, length - 1):
        logits = logits_at(ms.Tensor(buffer), ms.Tensor(position, ms.int32)).asnumpy()
        token = next_token(logits, greedy, temperature, top_p, rng)
        if token in STOP_IDS:
            break
        generated.append(token)
        buffer[0, position + 1] = token
        text = tokenizer.decode(generated)
        if not text.endswith("\ufffd") and len(text) > len(shown):  # wait for whole UTF-8 characters
            on_text(text[len(shown):])
            shown = text
        if stop(text):
            break
    return generated


def generate(checkpoint: Path, prompt: str, system: Optional[str] = None, max_new_tokens: int = 128,
             greedy: bool = True, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
             on_text: Callable[[str], None] = lambda _: None, device: str = "auto",
             weights: str = "stored") -> List[int]:
    """The generated token ids (without the stop token); `on_text` receives the text as it grows."""

    tokenizer = load_tokenizer(checkpoint_tokenizer(Path(checkpoint)))
    ids = prompt_ids(tokenizer, prompt, system)
    net, _, _ = build_from_checkpoint(Path(checkpoint), len(ids) + max_new_tokens, device=device, weights=weights)
    return decode(net, tokenizer, ids, max_new_tokens, greedy, temperature, top_p, seed, on_text)
