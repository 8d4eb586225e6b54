"""LoRA through mindformers.pet: low-rank adapters on the chosen linear layers, the rest of
the model frozen.

Only adapter weights (mindpet_delta_lora_a/b) stay trainable, so only they reach the
optimizer and the checkpoints. Under mixed precision the frozen base is stored in the
compute dtype (it needs no fp32 master copy), the adapters in fp32.
"""
from __future__ import annotations

import logging

from ..recipe.schema import LoraSection


def _mute_mindpet_stdout() -> None:
    """mindpet's loggers print every freeze step at INFO on stdout ('[INFO] ... [SDK] : Start
    to freeze model'), among our own lines and in --json output; they are not logging.getLogger
    loggers, so runtime.mute_mindformers_info does not reach them (mindpet/log/log.py). Keep
    their stdout handlers to warnings; their service.log files keep everything."""
    from mindpet.log import log

    for logger in (log.logger, log.operation_logger):
        logger.stdout_level = "WARNING"  # read when its first record sets up its handlers (MxLogger.set_logger)
        for handler in logger.handlers:  # already set up: a second LoRA model in this process
            if isinstance(handler, log.CustomedStreamHandler):
                handler.setLevel(logging.WARNING)


def apply_lora(net, section: LoraSection, compute_dtype: str):
    """Replace the targeted layers of `net` (a LlamaForCausalLM, changed in place) with
    LoRA layers and freeze everything else. Returns `net`."""
    from mindformers.pet import LoraConfig, get_pet_model

    _mute_mindpet_stdout()

    config = LoraConfig(lora_rank=section.rank, lora_alpha=section.alpha, lora_dropout=section.dropout,
                        target_modules=section.target_modules, param_init_type="float32",
                        compute_dtype=compute_dtype)
    get_pet_model(net, config)  # swaps net.model's layers in place and freezes the base
    return net


def lora_cells(net):
    from mindpet.delta.lora import LoRADense

    return [cell for _, cell in net.cells_and_names() if isinstance(cell, LoRADense)]


def merge_lora(net) -> int:
    """Fold every adapter into its base weight: W <- W + (alpha / rank) B A, then zero B so
    the adapter adds nothing. Returns the number of layers merged."""
    from mindspore import ops

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
