"""The planner's figure a training run logs beside its measured peak."""
from __future__ import annotations

from ..model.architecture import LlamaShape
from .devices import get_device
from .planner import estimate, strategy_from_recipe


def planned_peak_bytes(recipe, shape: LlamaShape, params: int) -> int:
    """The planner's per-device peak for this recipe (its total less the free margin),
    logged beside the measured peak."""
    device = get_device(recipe.device.name, recipe.device.max_device_memory)
    plan = estimate(shape, params, device, strategy_from_recipe(recipe, recipe.device.name))
    return plan.total_bytes - plan.components["margin"]
