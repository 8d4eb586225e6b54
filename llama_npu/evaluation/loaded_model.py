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


def build_from_checkpoint(checkpoint: Path, max_seq_len: int, batch_size: int = 1, device: str = "auto",
                          weights: str = "stored"):
    """(net, loss_cell, tokenizer name) with the weights of `checkpoint` (a converted
    directory, a step or a run directory: pretrained.resolve_weights, or a Hugging Face
    directory) loaded, LoRA adapters folded in, computing in fp32. `weights` (eval's and
    generate's --weights: stored, fp16, int8) says how they are held: stored = fp32, or int8
    for a quantized directory (a LoRA run's adapters folded into it make it float)."""
    on_ascend = select_device(device)
    shape, tokenizer, stored, quantized, weights_file = checkpoint_weights(Path(checkpoint))
    mute_mindformers_info()
    recipe = inference_recipe(shape, max_seq_len, batch_size)
    net, loss_cell = held_weights(recipe, on_ascend, stored, quantized, shape, weights_file, weights)
    return net, loss_cell, tokenizer


def checkpoint_weights(checkpoint: Path):
    """(shape, tokenizer name, name -> Tensor as stored, quantized, the weights' file) of a
    converted, step, run or Hugging Face directory."""
    # imported here: --help imports this module; MindSpore and numpy, only to load a model
    from ..weights.pretrained import model_weights, resolve_weights

    if is_hf_directory(checkpoint):
        (shape, tokenizer, stored), quantized = hf_model_weights(checkpoint), False
        return shape, tokenizer, stored, quantized, checkpoint
    source = resolve_weights(checkpoint)
    shape, meta, stored = model_weights(source, keep_int8=True)
    quantized = bool(meta.get("quantization")) and source.adapters is None
    return shape, source.tokenizer, stored, quantized, source.weights


def reload_weights(net, checkpoint: Path, weights: str = "stored"):
    """Load `checkpoint`'s weights into `net` in place, so that the graphs compiled for `net`
    score them without compiling again; its tokenizer name, or None (nothing loaded) when it
    needs a network of its own: another shape, or weights held as int8 (held_weights).
    Compiled graphs read a Parameter's current value at each run (a plain forward has no
    branch whose reads the FACTS.md staleness of set_data concerns; checked by the --compare
    exams of tests/test_exams.py against transformers)."""
    from ..weights.pretrained import dequantized_weights, load_weights

    shape, tokenizer, stored, quantized, weights_file = checkpoint_weights(Path(checkpoint))
    if weights == "int8" or (weights == "stored" and quantized):
        return None
    floats = dequantized_weights(stored) if quantized else stored
    params = {p.name: tuple(p.shape) for p in net.get_parameters()}
    if any(params.get(name) != tuple(tensor.shape) for name, tensor in floats.items()):
        return None
    load_weights(net, floats, shape, weights_file)
    return tokenizer


def inference_recipe(shape, max_seq_len: int, batch_size: int):
    """The recipe eval and generate build a `shape` model from: fp32, the head chunked."""
    # The tiny preset with every size overridden is exactly the checkpoint's shape.
    sizes = {"hidden_size": shape.hidden_size, "num_layers": shape.num_layers, "num_heads": shape.num_heads,
             "num_kv_heads": shape.num_kv_heads, "intermediate_size": shape.intermediate_size}
    return recipe_from_dict({"model": {"preset": "tiny", **sizes},
                             "data": {"train_files": ["-"], "max_seq_len": max_seq_len},
                             "train": {"micro_batch_size": batch_size},
                             "strategies": {"chunked_ce": {"enabled": True, "chunk_size": EVAL_CHUNK}}})


def held_weights(recipe, on_ascend: bool, stored: dict, quantized: bool, shape, source: Path, weights: str):
    """(net, loss_cell) of `recipe` with `stored` (name -> Tensor, consumed) loaded as `weights` says."""
    # imported here: --help imports this module; MindSpore and numpy, only to load a model
    from mindspore.nn.utils import no_init_parameters

    from ..strategies.network import build_network
    from ..weights.int8_weights import load_int8
    from ..weights.pretrained import dequantized_weights, load_weights

    if weights == "int8" or (weights == "stored" and quantized):
        # The float linear weights are replaced before they are ever allocated; the embedding and the
        # norms are held in fp16, as `quantize` stores them.
        with no_init_parameters():
            net, loss_cell = build_network(recipe, on_ascend=on_ascend, variable_length=True, param_dtype="float16")
        load_int8(net, stored, quantized, shape, source, "dequant")  # fp32 compute: WQBMM takes none
        return net, loss_cell
    param_dtype = "float16" if weights == "fp16" else "float32"
    net, loss_cell = build_network(recipe, on_ascend=on_ascend, variable_length=True, param_dtype=param_dtype)
    load_weights(net, dequantized_weights(stored) if quantized else stored, shape, source)
    return net, loss_cell


def scoring_network(checkpoint: Path, max_seq_len: int, rows: int, device: str = "auto"):
    """(the network of `checkpoint`, LoRA adapters folded in, the head's chunk of tokens), as
    an objective's `eval --data` scoring takes it (objectives/ score)."""
    return build_from_checkpoint(checkpoint, max_seq_len, rows, device)[0], EVAL_CHUNK
