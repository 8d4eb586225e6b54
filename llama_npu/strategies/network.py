"""Recipe -> the network to train: the Llama model with each memory strategy applied.

One entry point per strategy, called in the order the cells nest: dtypes and recompute
shape the MindFormers config, LoRA rewrites the built model, chunked cross-entropy picks the
head+loss cell. Precision's loss scaling and accumulation act on the step (training/session.py).
"""
from __future__ import annotations

from ..model.architecture import resolve_shape
from ..model.llama import build_model, llama_config
from ..model.loss import CausalLMLoss
from ..recipe.schema import Recipe
from ..weights.pretrained import load_pretrained
from .chunked_ce import head_loss
from .lora import apply_lora, frozen_base_dtypes
from .parallel import mindformers_model_options, mindformers_parallel_config
from .precision import model_dtypes
from .recompute import recompute_config


def build_network(recipe: Recipe, on_ascend: bool, variable_length: bool = False, param_dtype=None):
    """(net, loss_cell): the LlamaForCausalLM and the summed-loss cell wrapping it.
    `variable_length`: inputs may be shorter than data.max_seq_len (eval's length buckets);
    MindFormers' is_dynamic then slices its causal mask to each input's length instead of
    broadcasting one of seq_length (mindformers/modules/transformer/transformer.py
    LowerTriangularMaskWithDynamic). `param_dtype`: the weights' storage dtype instead of the
    precision strategy's (eval --weights fp16 holds them in fp16, computes in fp32)."""
    s = recipe.strategies
    # Every strategy's part of the MindFormers config first, then the model, then what acts on the built model.
    dtypes = model_dtypes(s.precision)
    if s.lora.enabled:
        dtypes = frozen_base_dtypes(dtypes)
    if param_dtype:
        dtypes = dict(dtypes, param_dtype=param_dtype)
    parallel_config = dict(mindformers_parallel_config(s.parallel), recompute=recompute_config(s.recompute))
    options, shape = mindformers_model_options(s.parallel), resolve_shape(recipe.model)
    config = llama_config(shape, recipe.data.max_seq_len, on_ascend,
                          device_name=recipe.device.name, parallel_config=parallel_config,
                          is_dynamic=variable_length, **options, **dtypes)
    net = build_model(config)
    loaded = load_pretrained(net, recipe, shape) if recipe.model.checkpoint else None
    if s.lora.enabled:
        apply_lora(net, s.lora, dtypes["compute_dtype"])
    if s.lora.base_dtype == "int8":
        from ..weights.int8_weights import hold_base_in_int8  # imported here: it loads MindSpore, which plan does not

        hold_base_in_int8(net, loaded, recipe, on_ascend, dtypes["compute_dtype"])
    head = head_loss(s.chunked_ce, net.lm_head)
    loss_cell = CausalLMLoss(net, head)
    loss_cell.set_train(True)
    return net, loss_cell
