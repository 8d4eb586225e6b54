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

from dataclasses import dataclass
from typing import List

from ..model.architecture import resolve_shape
from ..recipe.problems import RecipeError, choice

KEY = "recompute"
CHECKED_AFTER = ("model",)  # layers is bounded by the model's
PROFILE_MODES = {"off": "none", "on": "full", "selective": "selective"}
PROFILE_EXPECTED = "off, on or selective"


@dataclass
class RecomputeSection:
    mode: str = "none"  # none | full | selective
    layers: int = 0  # full only: recompute the first N layers; 0 means all


SECTION = RecomputeSection


def check(recipe) -> None:
    section = recipe.strategies.recompute
    choice("strategies.recompute.mode", section.mode, ("none", "full", "selective"))
    num_layers = resolve_shape(recipe.model).num_layers
    if not 0 <= section.layers <= num_layers:
        raise RecipeError(f"strategies.recompute.layers: expected 0 (all) to {num_layers} "
                          f"(model layers), got {section.layers}")
    if section.layers and section.mode != "full":
        raise RecipeError(f"strategies.recompute.layers={section.layers} needs "
                          f"strategies.recompute.mode=full, got {section.mode!r}")


def rehearse(r) -> None:
    """Recompute rehearses as set, on at most the rehearsal model's layers."""
    if r.recipe.strategies.recompute.layers > r.tiny.num_layers:
        r.change("strategies.recompute.layers", r.tiny.num_layers)


def profile_value_ok(value: str) -> bool:
    return value in PROFILE_MODES


def profile_overrides(value: str, base) -> List[str]:
    mode = PROFILE_MODES[value]
    layers = base.strategies.recompute.layers if mode == "full" else 0  # layers applies to full only
    return [f"strategies.recompute.mode={mode}", f"strategies.recompute.layers={layers}"]


def recompute_config(section: RecomputeSection) -> dict:
    """The `recompute` entry of MindFormers' parallel_config for `section`."""
    if section.mode == "full":
        # A list gives the number of recomputed layers per pipeline stage (one stage here).
        return {"recompute": [section.layers] if section.layers else True, "select_recompute": False}
    if section.mode == "selective":
        return {"recompute": False, "select_recompute": True}
    return {"recompute": False, "select_recompute": False}


# ---------------------------------------------------------------- planner term

def plan_settings(recipe) -> dict:
    return {"recompute": recipe.strategies.recompute.mode, "recompute_layers": recipe.strategies.recompute.layers}


def selective_kept(s, mlp: int, scores: int, repeated_kv: int) -> tuple[int, int]:
    """(MLP, attention scores) bytes one layer keeps: under selective recompute half the
    MLP's (SwiGLU's product and SiLU are recomputed) and, without flash attention, of the
    scores only the repeated k/v (the scores and softmax are recomputed)."""
    if s.recompute != "selective":
        return mlp, scores
    return mlp // 2, scores if s.flash_attention else repeated_kv


def kept_activations(s, layers: int, per_layer: int, layer_input: int) -> int:
    """What the layers of a device keep for the backward pass of one micro-batch."""
    if s.recompute != "full":
        return layers * per_layer
    recomputed = layers if not s.recompute_layers else min(s.recompute_layers, layers)
    # recomputed layers keep their input; one layer's activations exist while it is recomputed
    return recomputed * layer_input + (layers - recomputed) * per_layer + per_layer


def extra_flops(shape, params: int, s) -> float:
    """FLOPs a token of the recomputed forward: all of it for the layers fully recomputed (their
    share of 2 x parameters, and their attention's QK^T and AV, 4 x hidden x sequence a layer),
    a tenth of 2 x parameters selectively."""
    if s.recompute == "full":
        layers = s.recompute_layers or shape.num_layers
        return 2 * params * (layers / shape.num_layers) + 4 * layers * shape.hidden_size * s.seq_len
    return 0.1 * params if s.recompute == "selective" else 0
