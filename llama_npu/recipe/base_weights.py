"""The weights a run starts from: model.checkpoint, or random weights only where the recipe
says it means them. LoRA trains adapters over a frozen base, and adapters over a random base
are no model (eval, generate and the export refuse such a run: weights/pretrained.py), so a
LoRA recipe without model.checkpoint is refused unless it sets model.random_init: true.
`plan --write-recipe` writes CHECKPOINT_PLACEHOLDER into a LoRA recipe for the user to fill
in, and it is refused by name until they do. Pure Python: validate runs it."""
from __future__ import annotations

from .problems import RecipeError

CHECKPOINT_PLACEHOLDER = "FILL-IN: a `llama-npu convert hf-to-ms` directory"
CONVERT_HINT = "llama-npu convert hf-to-ms --src HF_DIR --dst weights/NAME makes one from a Hugging Face download"


def check_base(recipe, rehearsal: bool = False) -> None:
    """Raise RecipeError when the recipe still names the placeholder checkpoint, or would
    train LoRA over random weights it did not ask for (a `rehearsal` says so instead)."""
    m = recipe.model
    if m.checkpoint == CHECKPOINT_PLACEHOLDER:
        raise RecipeError(f"model.checkpoint: still the placeholder plan --write-recipe wrote ({m.checkpoint!r}); "
                          f"set it to the converted base weights ({CONVERT_HINT})")
    if recipe.strategies.lora.enabled and not m.checkpoint and not m.random_init and not rehearsal:
        raise RecipeError(f"model.checkpoint is not set, so LoRA would train adapters over random weights, which "
                          f"are no model; set model.checkpoint: DIR ({CONVERT_HINT}), or model.random_init: true "
                          f"to train over a random base on purpose")


def random_base_reason(recipe) -> str:
    """Why a run of `recipe` starts from random weights, or "" when it loads model.checkpoint."""
    m = recipe.model
    if m.checkpoint:
        return ""
    if m.random_init:
        return "model.random_init: true"
    return "the recipe sets no model.checkpoint" + (
        ", which train and validate refuse for LoRA" if recipe.strategies.lora.enabled else "")
