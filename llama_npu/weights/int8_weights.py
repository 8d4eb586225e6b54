"""A built network's decoder linear layers held as int8 at run time: `eval`/`generate` with
`--weights int8` or on a quantized directory, and LoRA with `strategies.lora.base_dtype: int8`.

Each MindFormers Linear (or mindpet LoRADense) named by a decoder linear weight
(quantize.LINEAR) is replaced in its parent, as mindpet replaces Linear by LoRADense
(mindformers/pet/tuners/lora_adapter.py recursive_replace_dense_cell: `net._cells[name] =
dest_cell`), by model/int8_linear.py's cell holding q and s. A quantized checkpoint's own q and
s are used as they are (re-quantizing q x s could move a scale by one ulp); a float weight is
quantized by quantize.quantize_rows, the scheme `llama-npu quantize` writes.
"""
from __future__ import annotations

import numpy as np

from ..model.int8_linear import Int8Linear, Int8LoRALinear, int8_kernel
from .pretrained import expected_tensors, load_weights, verify_scales
from .tensor_files import INT8_SCALE, LINEAR, quantize_rows


def int8_pairs(stored: dict, quantized: bool, source):
    """(name, q int8, s float32) of every decoder linear weight in `stored` (name -> Tensor),
    each taken out of `stored` as it is yielded (so that a float model is not held twice): a
    quantized checkpoint's own q and s (checked first), else the float weights quantized."""
    if quantized:
        verify_scales({name: tuple(t.shape) for name, t in stored.items()}, source)
    for name in [n for n in stored if LINEAR.match(n)]:
        weight = stored.pop(name).asnumpy()
        if quantized:
            yield name, weight.astype(np.int8), stored.pop(name + INT8_SCALE).asnumpy().astype(np.float32)
        else:
            yield (name, *quantize_rows(weight.astype(np.float32)))


def install_int8(net, pairs, kernel: str) -> int:
    """Replace each decoder linear cell of `net` named in `pairs` (int8_pairs) by its int8
    cell (a LoRA layer keeps its adapters), computing in the dtype the cell it replaces
    computes in. Returns the number of layers replaced."""
    from mindpet.delta.lora import LoRADense  # imported here: mindpet loads MindFormers' logging on import

    cells, replaced = dict(net.cells_and_names()), 0
    for name, q, scale in pairs:
        path = name[: -len(".weight")]
        parent_path, attr = path.rsplit(".", 1)
        old = cells[path]
        if isinstance(old, LoRADense):
            new = Int8LoRALinear(q, scale, old.dtype, kernel, old)
        else:
            new = Int8Linear(q, scale, old.dtype, kernel, old.activation)
        new.weight.name, new.int8_scale.name = name, path + ".int8_scale"
        cells[parent_path]._cells[attr] = new  # pylint: disable=protected-access  (as mindpet does)
        replaced += 1
    return replaced


def load_int8(net, stored: dict, quantized: bool, shape, source, kernel: str) -> int:
    """`stored` (a checkpoint's tensors, consumed) into `net`: its decoder linear weights as
    int8 cells, the rest (embedding, norms) into their Parameters. Returns the layers replaced."""
    kept = [name for name in expected_tensors(shape) if not LINEAR.match(name)]
    load_weights(net, stored, shape, source, names=kept)  # checks every tensor's name and shape first
    return install_int8(net, int8_pairs(stored, quantized, source), kernel)


def float_linear_weights(net) -> dict:
    """name -> Tensor of the network's own float decoder linear weights (LoRA from random init)."""
    return {p.name: p for p in net.get_parameters() if LINEAR.match(p.name)}


def hold_base_in_int8(net, loaded, recipe, on_ascend: bool, compute_dtype: str) -> int:
    """base_dtype int8: the base's decoder linear layers become int8 cells (model/int8_linear.py)
    from `loaded` (load_pretrained's (tensors as stored, quantized)), else from the randomly
    initialized float weights. The float copy the network was built with is dropped here,
    before the first step: it never reaches the device."""
    stored, quantized = loaded if loaded else (float_linear_weights(net), False)
    source = recipe.model.checkpoint or "the random initial weights"
    kernel = int8_kernel(on_ascend, recipe.device.name, compute_dtype)
    return install_int8(net, int8_pairs(stored, quantized, source), kernel)
