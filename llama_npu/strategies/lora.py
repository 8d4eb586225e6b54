"""LoRA through mindformers.pet: low-rank adapters on the chosen linear layers, the rest of
the model frozen.

Only adapter weights (mindpet_delta_lora_a/b) stay trainable, so only they reach the
optimizer and the checkpoints. Under mixed precision the frozen base is stored in the
compute dtype (it needs no fp32 master copy), the adapters in fp32; with `base_dtype: int8`
it is held as int8 weights with per-output-channel scales (model/int8_linear.py), each
layer dequantized inside its forward and again in its backward.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from ..model.architecture import LINEAR_LAYERS, matched_layers
from ..recipe.problems import RecipeError, choice, positive

KEY = "lora"
CHECKED_AFTER = ("model", "recompute", "chunked_ce")  # one memory strategy's problem at a time
PROFILE_SWITCH = "strategies.lora.enabled"  # profiled off and on
# The (in, out) sizes of each linear layer: hidden, the MLP's and the KV heads'.
SHAPES = {"wq": ("h", "h"), "wk": ("h", "kv"), "wv": ("h", "kv"), "wo": ("h", "h"),
          "w1": ("h", "f"), "w2": ("f", "h"), "w3": ("h", "f")}
BASE_DTYPES = ("compute", "int8")  # how the frozen base is held: the compute dtype, or int8 + scales


@dataclass
class LoraSection:
    enabled: bool = False
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: str = ".*wq|.*wk|.*wv|.*wo"  # regex over wq wk wv wo w1 w2 w3
    base_dtype: str = "compute"  # compute | int8: the frozen base's linear weights as int8 + per-row scales


SECTION = LoraSection


def check(recipe) -> None:
    section = recipe.strategies.lora
    choice("strategies.lora.base_dtype", section.base_dtype, BASE_DTYPES)
    if section.base_dtype == "int8":
        check_int8_base(recipe)
    if not section.enabled:
        return
    positive("strategies.lora.rank", section.rank)
    positive("strategies.lora.alpha", section.alpha)
    if not 0.0 <= section.dropout < 1.0:
        raise RecipeError(f"strategies.lora.dropout: expected a value in [0, 1), got {section.dropout}")
    try:
        matched = matched_layers(section.target_modules)
    except re.error as exc:
        raise RecipeError(f"strategies.lora.target_modules: not a valid regex ({exc})") from None
    if not matched:
        raise RecipeError(f"strategies.lora.target_modules={section.target_modules!r} matches no layer; "
                          f"the linear layers are {', '.join(LINEAR_LAYERS)}")


def check_int8_base(recipe) -> None:
    """An int8 base is frozen: only LoRA trains over it, and it is not split by model parallel."""
    if not recipe.strategies.lora.enabled:
        raise RecipeError("strategies.lora.base_dtype=int8 needs strategies.lora.enabled=true: a full fine-tune "
                          "trains the base weights, which int8 cannot hold")
    model_parallel = recipe.strategies.parallel.model
    if isinstance(model_parallel, int) and model_parallel > 1:
        raise RecipeError(f"strategies.lora.base_dtype=int8 with strategies.parallel.model={model_parallel}: the "
                          f"int8 base is not sharded along its output dimension (nor its scales); use "
                          f"strategies.parallel.model=1 or base_dtype=compute")


def _mute_mindpet_stdout() -> None:
    """mindpet's loggers print every freeze step at INFO on stdout ('[INFO] ... [SDK] : Start
    to freeze model'), among our own lines and in --json output; they are not logging.getLogger
    loggers, so runtime.mute_mindformers_info does not reach them (mindpet/log/log.py). Keep
    their stdout handlers to warnings; their service.log files keep everything."""
    from mindpet.log import log  # imported here: recipe validation imports this module without MindSpore

    for logger in (log.logger, log.operation_logger):
        logger.stdout_level = "WARNING"  # read when its first record sets up its handlers (MxLogger.set_logger)
        for handler in logger.handlers:  # already set up: a second LoRA model in this process
            if isinstance(handler, log.CustomedStreamHandler):
                handler.setLevel(logging.WARNING)


def apply_lora(net, section: LoraSection, compute_dtype: str):
    """Replace the targeted layers of `net` (a LlamaForCausalLM, changed in place) with
    LoRA layers and freeze everything else. Returns `net`."""
    from mindformers.pet import LoraConfig, get_pet_model  # imported here: as mindpet above

    _mute_mindpet_stdout()

    config = LoraConfig(lora_rank=section.rank, lora_alpha=section.alpha, lora_dropout=section.dropout,
                        target_modules=section.target_modules, param_init_type="float32",
                        compute_dtype=compute_dtype)
    get_pet_model(net, config)  # swaps net.model's layers in place and freezes the base
    return net


def lora_cells(net):
    from mindpet.delta.lora import LoRADense  # imported here: as mindpet above

    return [cell for _, cell in net.cells_and_names() if isinstance(cell, LoRADense)]


def merge_lora(net) -> int:
    """Fold every adapter into its base weight: W <- W + (alpha / rank) B A, then zero B so
    the adapter adds nothing. Returns the number of layers merged."""
    from mindspore import ops  # imported here: as mindpet above

    cells = lora_cells(net)
    for cell in cells:
        a = cell.mindpet_delta_lora_a.astype("float32")  # (r, in)
        b = cell.mindpet_delta_lora_b.astype("float32")  # (out, r)
        merged = cell.weight.astype("float32") + cell.scaling * ops.matmul(b, a)
        cell.weight.set_data(merged.astype(cell.weight.dtype))
        cell.mindpet_delta_lora_b.set_data(ops.zeros_like(cell.mindpet_delta_lora_b))
    return len(cells)


def frozen_base_dtypes(dtypes: dict) -> dict:
    """Model dtypes under LoRA: the frozen base is stored in the compute dtype."""
    return dict(dtypes, param_dtype=dtypes["compute_dtype"])


# ---------------------------------------------------------------- planner term

def plan_settings(recipe) -> dict:
    section = recipe.strategies.lora
    return {"lora": section.enabled, "lora_rank": section.rank,
            "lora_targets": tuple(matched_layers(section.target_modules)), "lora_base_dtype": section.base_dtype}


def lora_params_per_layer(shape, rank: int, targets) -> int:
    dims = {"h": shape.hidden_size, "f": shape.intermediate_size, "kv": shape.num_kv_heads * shape.head_dim}
    return sum(rank * (dims[i] + dims[o]) for name, (i, o) in SHAPES.items() if name in targets)


def trainable_params(shape, s, layers: int, on_device: int) -> int:
    """The parameters a device trains: the adapters of its layers (split like the base by
    model parallel), or every parameter it holds."""
    if not s.lora:
        return on_device
    return layers * lora_params_per_layer(shape, s.lora_rank, s.lora_targets) // s.model


def flops_per_parameter(s) -> int:
    """6 FLOPs per parameter and token; 4 with LoRA: no weight gradients of the frozen base."""
    return 4 if s.lora else 6
