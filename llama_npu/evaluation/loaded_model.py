"""A model built for inference from a checkpoint: a converted directory, a step or a run
directory, or a Hugging Face directory; the device it runs on and the tokenizer it was
trained with. Used by `eval`, `generate` and the exam scorer."""
from __future__ import annotations

import json
from pathlib import Path

from ..common.frameworks import mute_mindformers_info
from ..recipe.load import recipe_from_dict
from ..recipe.problems import RecipeError

EVAL_CHUNK = 256  # tokens of logits at a time: 256 x 128,256 fp32 is 131 MB


def ascend_usable() -> bool:
    """MindSpore loaded its Ascend plugin (CANN present) and sees at least one device."""
    import mindspore as ms  # imported here: --help imports this module; MindSpore and numpy, only to load a model

    try:
        return ms.device_context.ascend.is_available() and ms.device_context.ascend.device_count() > 0
    except RuntimeError:
        return False


def select_device(device: str) -> bool:
    """Set MindSpore's device for `--device auto|cpu|ascend`; True when it is Ascend."""
    import mindspore as ms  # imported here: --help imports this module; MindSpore and numpy, only to load a model

    on_ascend = ascend_usable() if device == "auto" else device == "ascend"
    if device == "ascend" and not ascend_usable():
        raise RecipeError("--device ascend: MindSpore reports no usable Ascend device here (no CANN plugin "
                          "or no NPU); use --device cpu")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("Ascend" if on_ascend else "CPU")
    return on_ascend


def is_hf_directory(path: Path) -> bool:
    """A Hugging Face model directory (config.json with a model_type), not one of ours."""
    config = Path(path) / "config.json"
    if not config.is_file() or (Path(path) / "recipe.yaml").is_file():
        return False
    try:
        meta = json.loads(config.read_text(encoding="utf-8"))
    except ValueError:
        return False
    return isinstance(meta, dict) and "model_type" in meta and meta.get("format") != "llama-npu"


def hf_model_weights(src: Path):
    """(shape, tokenizer, name -> float32 Tensor in MindFormers' names) of a Hugging Face
    Llama 3.2 directory, read as `convert hf-to-ms` reads it, with nothing written."""
    import mindspore as ms  # imported here: --help imports this module; MindSpore and numpy, only to load a model

    from ..weights.convert import checked_hf_model
    from ..weights.tensor_files import rename, to_float32

    shape, _, tensors = checked_hf_model(src)
    weights = {rename(name, to_ms=True): ms.Tensor(to_float32(stored.read(), stored.code))
               for name, stored in tensors.items()}
    tokenizer = str(src / "tokenizer.json") if (src / "tokenizer.json").is_file() else "llama3.2"
    return shape, tokenizer, weights


def checkpoint_tokenizer(checkpoint: Path) -> str:
    """The tokenizer a checkpoint eval, generate or the exam scorer takes was trained with."""
    # imported here: --help imports this module; MindSpore and numpy, only to load a model
    from ..weights.pretrained import resolve_weights

    if is_hf_directory(checkpoint):
        return str(checkpoint / "tokenizer.json") if (checkpoint / "tokenizer.json").is_file() else "llama3.2"
    return resolve_weights(Path(checkpoint)).tokenizer


def build_from_checkpoint(checkpoint: Path, max_seq_len: int, batch_size: int = 1, device: str = "auto"):
    """(net, loss_cell, tokenizer name) in fp32 with the weights of `checkpoint` (a converted
    directory, a step or a run directory: pretrained.resolve_weights, or a Hugging Face
    directory) loaded, LoRA adapters folded in."""
    # imported here: --help imports this module; MindSpore and numpy, only to load a model
    from ..strategies.network import build_network
    from ..weights.pretrained import load_weights, model_weights, resolve_weights

    on_ascend = select_device(device)
    if is_hf_directory(checkpoint):
        shape, tokenizer, weights = hf_model_weights(Path(checkpoint))
        weights_file = Path(checkpoint)
    else:
        source = resolve_weights(Path(checkpoint))
        shape, _, weights = model_weights(source)
        tokenizer, weights_file = source.tokenizer, source.weights
    # The tiny preset with every size overridden is exactly the checkpoint's shape.
    sizes = {"hidden_size": shape.hidden_size, "num_layers": shape.num_layers, "num_heads": shape.num_heads,
             "num_kv_heads": shape.num_kv_heads, "intermediate_size": shape.intermediate_size}
    recipe = recipe_from_dict({"model": {"preset": "tiny", **sizes},
                               "data": {"train_files": ["-"], "max_seq_len": max_seq_len},
                               "train": {"micro_batch_size": batch_size},
                               "strategies": {"chunked_ce": {"enabled": True, "chunk_size": EVAL_CHUNK}}})
    mute_mindformers_info()
    net, loss_cell = build_network(recipe, on_ascend=on_ascend, variable_length=True)
    load_weights(net, weights, shape, weights_file)
    return net, loss_cell, tokenizer
