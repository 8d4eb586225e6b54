"""The training strategies, one module each, switched on from the recipe's `strategies:` section.

Each module owns its effect on the network (strategies/network.py composes them) and:
- KEY, and SECTION: its dataclass under `strategies.KEY` (None when its keys sit elsewhere);
- check(recipe): raises RecipeError naming its problems; it runs once the checks named in
  CHECKED_AFTER passed ("model": the model's shape, "sizes": the train section's numbers,
  else another strategy's KEY);
- plan_settings(recipe): its keys of the planner's Strategy, and its planner terms.
Where it has them: resolve(recipe, workers) completes its section when the recipe loads;
rehearse(rehearsal) shrinks its keys for a CPU rehearsal; extra_flops(shape, params, s), FLOPs a token, is
the work it adds to a step; PROFILE_SWITCH, or profile_overrides / profile_value_ok /
PROFILE_EXPECTED, make it an axis of `llama-npu profile`.
The recipe, the planner, rehearse and the profile go through STRATEGIES.
"""
from . import accumulation, chunked_ce, lora, offload, parallel, precision, recompute

# In the order of the recipe's sections and of their checks.
STRATEGIES = (precision, recompute, chunked_ce, lora, parallel, accumulation, offload)
