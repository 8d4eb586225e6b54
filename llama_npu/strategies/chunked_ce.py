"""Chunked cross-entropy: the LM head and the loss computed `chunk_size` tokens at a time, so
that at most one chunk of the vocabulary-wide logits exists (the cells and why:
model/chunked_loss.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..recipe.problems import positive

KEY = "chunked_ce"
CHECKED_AFTER = ("model", "recompute")  # one memory strategy's problem at a time, as validation lists them
PROFILE_SWITCH = "strategies.chunked_ce.enabled"  # profiled off and on
REHEARSAL_CHUNK = 16  # chunked CE must still cut the rehearsal's 32-token sequences into pieces


@dataclass
class ChunkedCESection:
    enabled: bool = False
    chunk_size: int = 1024  # tokens per chunk of the LM head + loss


SECTION = ChunkedCESection


def check(recipe) -> None:
    positive("strategies.chunked_ce.chunk_size", recipe.strategies.chunked_ce.chunk_size)


def rehearse(r) -> None:
    section = r.recipe.strategies.chunked_ce
    if section.enabled:
        r.change("strategies.chunked_ce.chunk_size", min(section.chunk_size, REHEARSAL_CHUNK))


def head_loss(section: ChunkedCESection, lm_head):
    """The head+loss cell for CausalLMLoss: chunked when enabled, else None (full path)."""
    from ..model.chunked_loss import ChunkedHeadLoss  # imported here: it loads MindSpore, needless for validate

    return ChunkedHeadLoss(lm_head, section.chunk_size) if section.enabled else None


# ---------------------------------------------------------------- planner term

def plan_settings(recipe) -> dict:
    return {"chunked_ce": recipe.strategies.chunked_ce.enabled, "chunk_size": recipe.strategies.chunked_ce.chunk_size}


def logits_rows(s, tokens: int) -> int:
    """Rows of the vocabulary-wide logits alive at once: one chunk, or every token."""
    return min(s.chunk_size, tokens) if s.chunked_ce else tokens


def hidden_gradient(s, tokens: int, hidden_size: int) -> int:
    """The custom backward's fp32 gradient of the hidden states, built chunk by chunk."""
    return tokens * hidden_size * 4 if s.chunked_ce else 0


def head_gradient_copies(s) -> int:
    """fp32 copies of the LM head's weight gradient alive at once in the backward. Chunked:
    ChunkedTokenLogProbs.bprop (model/chunked_loss.py) computes `d_weight = d_weight +
    matmul(...).astype(fp32)`, out of place, so at each chunk's add the previous sum, the
    chunk's fp32 product and the new sum are alive: three (the product's half-precision
    original is freed by its cast, before the add). Unchunked, autodiff's one. Under LoRA the
    head is frozen and the planner counts no head gradient: the compile prunes the unused
    d_weight chain (a CPU IR dump of a LoRA step's validate graph holds no fp32 tensor of the
    embedding's shape but the weight's Load; the full fine-tune's holds the chunks' MatMul and
    Add: checked by hand, not by a test)."""
    return 3 if s.chunked_ce else 1


def extra_flops(shape, params: int, s) -> int:
    """Each chunk's head matmul, recomputed in the backward."""
    return 2 * shape.vocab_size * shape.hidden_size if s.chunked_ce else 0
