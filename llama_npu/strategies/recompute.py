"""Recompute (activation checkpointing), mapped onto MindFormers' recompute configuration.

- full: every decoder layer (or only the first `layers` of them) keeps just its input and
  recomputes the rest in the backward pass; MindFormers' `recompute: true` or `[N]`.
- selective: only the cheap-to-recompute, large activations: the SwiGLU product and SiLU
  (MindFormers' default select_recompute patterns) and, without flash attention, the
  attention scores and softmax.
MindFormers applies these through LayerSetting when it builds each LLamaDecodeLayer
(mindformers/parallel_core/training_graph/transformer/utils.py).

On the CPU backend the graph still computes the same values, so loss and gradients are
unchanged, but CPU memory does not show the saving (FACTS.md): only Ascend does.
"""
from __future__ import annotations

from ..recipe.schema import RecomputeSection


def recompute_config(section: RecomputeSection) -> dict:
    """The `recompute` entry of MindFormers' parallel_config for `section`."""
    if section.mode == "full":
        # A list gives the number of recomputed layers per pipeline stage (one stage here).
        return {"recompute": [section.layers] if section.layers else True, "select_recompute": False}
    if section.mode == "selective":
        return {"recompute": False, "select_recompute": True}
    return {"recompute": False, "select_recompute": False}
