"""Recipe -> the network to train: the Llama model with each memory strategy applied.

One entry point per strategy, called in the order the cells nest: dtypes and recompute
shape the MindFormers config, LoRA rewrites the built model, chunked cross-entropy picks the
head+loss cell. Precision's loss scaling and accumulation act on the step (train.py).
"""
from __future__ import annotations

from pathlib import Path

from .recipe import Recipe


def build_network(recipe: Recipe, on_ascend: bool):
    """(net, loss_cell): the LlamaForCausalLM and the summed-loss cell wrapping it."""
    from .loss import CausalLMLoss
    from .model import build_model, llama_config, resolve_shape
    from .strategies.chunked_ce import head_loss
    from .strategies.lora import apply_lora, frozen_base_dtypes
    from .strategies.parallel import mindformers_parallel_config
    from .strategies.precision import model_dtypes
    from .strategies.recompute import recompute_config

    s = recipe.strategies
    dtypes = model_dtypes(s.precision)
    if s.lora.enabled:
        dtypes = frozen_base_dtypes(dtypes)
    parallel_config = dict(mindformers_parallel_config(s.parallel), recompute=recompute_config(s.recompute))
    config = llama_config(resolve_shape(recipe.model), recipe.data.max_seq_len, on_ascend,
                          device_name=recipe.device.name, parallel_config=parallel_config, **dtypes)
    net = build_model(config)
    if recipe.model.checkpoint:
        load_pretrained(net, recipe)
    if s.lora.enabled:
        apply_lora(net, s.lora, dtypes["compute_dtype"])
    loss_cell = CausalLMLoss(net, head_loss(s.chunked_ce, net.lm_head))
    loss_cell.set_train(True)
    return net, loss_cell


def load_pretrained(net, recipe: Recipe) -> None:
    """Load a converted checkpoint (model.checkpoint) into the freshly built model."""
    import mindspore as ms

    from .convert import WEIGHTS, read_checkpoint_dir
    from .model import resolve_shape
    from .recipe import RecipeError

    directory = Path(recipe.model.checkpoint)
    shape, meta = read_checkpoint_dir(directory)
    if shape != resolve_shape(recipe.model):
        raise RecipeError(f"model.checkpoint={directory} holds {shape.describe()}, but model.preset="
                          f"{recipe.model.preset} is {resolve_shape(recipe.model).describe()}")
    weights = ms.load_checkpoint(str(directory / WEIGHTS))
    if meta.get("quantization"):  # int8 + scales -> the float weights they stand for
        from .quantize import dequantize

        weights = {k: ms.Parameter(ms.Tensor(v), name=k) for k, v in
                   dequantize({k: p.asnumpy() for k, p in weights.items()}).items()}
    names = {p.name for p in net.get_parameters()}
    missing = sorted(n for n in names if n not in weights and n.startswith("model."))
    if missing:
        raise RecipeError(f"{directory / WEIGHTS}: lacks {missing[0]} ({len(missing)} tensors missing)")
    ms.load_param_into_net(net, weights, strict_load=True)
