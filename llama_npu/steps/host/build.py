"""`host_optimizer(recipe, params, world)`: the host's states for a run whose recipe puts the
optimizer on the host (strategies.offload.optimizer: host), or None."""
from __future__ import annotations

from typing import Optional

from mindspore.common import dtype as mstype

from ...common.console import note
from ...recipe.problems import RecipeError
from ...recipe.schema import Recipe
from ...strategies.offload import host_threads, on_host
from ...strategies.parallel import World
from ...strategies.precision import model_dtypes


def host_optimizer(recipe: Recipe, params: list, world: Optional[World] = None):
    """The host's states (strategies.offload.optimizer: host) for the card's `params`, this
    rank's range of them under data parallel, or None."""
    if not on_host(recipe):
        return None
    try:
        from .optimizer import HostAdamW  # imported here: it loads numba, which no other run needs
    except ImportError as exc:
        from .kernel_check import INSTALL

        raise RecipeError(f"strategies.offload.optimizer=host: the host update's kernel does not import ({exc}); "
                          f"install it: {INSTALL}") from None

    compute = model_dtypes(recipe.strategies.precision)["compute_dtype"]
    threads, world = host_threads(recipe.strategies.offload), world or World()
    host = HostAdamW(params, recipe.train.optimizer, threads, getattr(mstype, compute), world.rank, world.size)
    held = host.held_elements()
    # fp32 master, two moments and an accumulator a parameter
    share = "" if world.size == 1 else f" (rank {world.rank}'s range: {held:,} of {sum(p.size for p in params):,})"
    note(f"the optimizer on the host: {threads} thread(s), {16 * held / 2**30:.2f} GiB of fp32 master weights, "
         f"moments and gradient accumulators in host memory{share}; the card keeps {compute} weights")
    return host
