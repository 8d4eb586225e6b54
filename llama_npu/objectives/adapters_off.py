"""dpo.reference adapters_off: the reference log-probs of a LoRA run come from the same network
with its adapters switched off, in the train step's own graph, with no second copy of the
weights (TRL's DPOTrainer does the same with peft's `disable_adapter()` context,
trl/trainer/dpo_trainer.py compute_ref_log_probs / null_ref_context).

The switch: every LoRA layer multiplies its delta by `scaling` (alpha / rank; mindpet's
LoRADense.construct in mindpet/delta/lora.py and model/int8_linear.py Int8LoRALinear.base
read `self.scaling`). Here that float becomes one non-trainable scalar Parameter shared by
all LoRA layers; the graph assigns it 0, runs the reference forward under stop_gradient,
assigns it alpha / rank again, then runs the policy forward. MindSpore orders a Parameter's
reads after the assigns that precede them in the program (auto-monad), so one graph holds
both forwards, and the backward reads the policy's value. The reference forward keeps no
activations for a backward (memory/planner.py counts its own peak, before the policy's
forward). The scalar is not trainable, so it is in no checkpoint; between steps it holds
alpha / rank, so merging and exporting the adapters (strategies/lora.py merge_lora) read
the same value as before.
"""
from __future__ import annotations

import numpy as np

import mindspore as ms
from mindspore import Parameter, nn, ops


def adapter_layers(net) -> list:
    """The LoRA layers of `net`: mindpet's LoRADense, or Int8LoRALinear over an int8 base."""
    return [cell for _, cell in net.cells_and_names() if hasattr(cell, "mindpet_delta_lora_b")]


def install_adapter_switch(net) -> Parameter:
    """Every LoRA layer of `net` reads its scaling from one shared scalar Parameter (returned)."""
    layers = adapter_layers(net)
    if not layers:
        raise ValueError("reference adapters_off (dpo.reference, kto.reference): the network has no LoRA layer")
    values = {float(cell.scaling) for cell in layers}
    if len(values) != 1:  # one LoraConfig scales them all (strategies/lora.py apply_lora)
        raise ValueError(f"LoRA layers with different scalings {sorted(values)}: one switch cannot serve them")
    switch = Parameter(ms.Tensor(np.float32(values.pop())), name="lora_adapter_scaling", requires_grad=False)
    for cell in layers:
        cell.scaling = switch
    return switch


class AdaptersOffReference(nn.Cell):
    """(input_ids, labels) -> (2P,) summed reply log-probs of the network with its adapters off,
    without gradient; `ready(x)` returns x once the adapters are back on (the policy forward
    must read its inputs through it)."""

    def __init__(self, sequences, switch: Parameter):
        super().__init__(auto_prefix=False)
        self.sequences = sequences
        self.switch = switch
        self.on = float(switch.asnumpy())

    def construct(self, input_ids, labels):
        off = ops.assign(self.switch, ops.zeros_like(self.switch))
        reference, _ = self.sequences(ops.depend(input_ids, off), labels)
        reference = ops.stop_gradient(reference)
        # Back on only after the reference forward has read the switch.
        on = ops.assign(self.switch, ops.depend(ops.ones_like(self.switch) * self.on, reference))
        return ops.depend(reference, on)
