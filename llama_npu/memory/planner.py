"""The memory planner: what a recipe needs per device, tensor class by tensor class, the
peak over the step's phases, and a search over the plans that fit (memory/fit_choice.py
ranks them; memory/step_time.py predicts their step time).

Every number is a formula over the exact parameter counts and the recipe; the formulas
follow this harness's implementation, not an idealised trainer (docs/memory.md says which
tensors are alive in which phase):
- weights: parameters in their stored dtype (fp32 under O0-O2, the half dtype under O3; a
  LoRA base in the compute dtype, or its linear weights in int8 with fp32 scales) plus,
  under O1/O2, the half-precision copies the matmuls use, which autodiff keeps for the
  backward pass (freed before the update);
- gradients: one micro-batch a step: the gradients themselves, in the trainable
  parameters' dtype, from the backward to the update. Accumulating: the fp32 accumulators,
  alive the whole step;
- micro_batch_gradients (accumulating only): one micro-batch's whole gradient beside the
  accumulators at the end of its backward, before it is added in. That is the worst case, and
  it is counted because nothing in the step guarantees better: MindSpore runs a graph in a
  topological order (exec_order "bfs" by default, mindspore/context.py), chosen without
  regard to memory, so a gradient need not be added in as soon as the backward produces it;
- embedding_gradient: the tied embedding's fp32 gradient in flight: the LM head's part from
  the start of the backward (three copies of it under chunked cross-entropy:
  strategies/chunked_ce.py head_gradient_copies). Our train step adds the lookup's part as rows at the tokens'
  rows (in place into the accumulator, or into one copy at k = 1); MindFormers' sharded
  wrappers keep autodiff's dense lookup part and the sum at the backward's end;
- optimizer states: AdamW's two fp32 moments; MindSpore's SGD keeps `accum` and `stat`
  buffers even without momentum, also 8 bytes a parameter; divided by data parallel with
  optimizer sharding;
- activations: what the backward pass keeps per decoder layer (below), times the layers on
  the device, times the micro-batches a pipeline stage holds in flight;
- logits and loss: the LM head output and the cross-entropy's fp32 buffers over the whole
  micro-batch, or over one chunk with chunked cross-entropy;
- update_copies: what the update makes beside the gradients. Our train step unscales and
  clips fp32 gradients in place (steps/graph_step.py), so only data parallel's all-reduce output
  exists, one fusion bucket at a time (the 64 MB threshold, or the largest gradient); where it
  multiplies out of place -- on the 910A, whose default jit level O2 compiles for GE, which
  has no InplaceMul, and O3's half gradients, multiplied in fp32 one at a time -- a whole
  new set of gradients at the worst case (strategies/precision.py scaling_copies);
  MindFormers' wrappers of the sharded layouts scale the accumulators out of place
  (mindformers/wrapper/wrapper.py MFPipelineWithLossScaleCell): a full fp32 set;
- communication buffers: HCCL keeps 2 x HCCL_BUFFSIZE (200 MB by default) per communicator,
  outside MindSpore's pool: they must fit in the HBM the pool leaves (hbm - max_device_memory);
- dequantized_weight (an int8 base only): the linear weights dequantized at once, in the
  forward and again in the backward, never kept across the step nor shared between two
  forwards (memory/int8_weights.py: the worst group of layers nothing orders apart); none on
  the 910B, whose kernel dequantizes inside the matmul;
- reference_forward (dpo.reference adapters_off only): the reference's forward without
  gradients in the train step, before the policy's (objectives/adapters_off.py): one decoder
  layer's activations at a time, the layer input and output, and the head's log-prob buffers
  without the logits' gradient; its own phase, "reference";
- margin: 10% of the usable memory, kept free for the runtime and fragmentation.
The plan's total is the largest phase (forward, backward, update, reference) plus the margin; it fits
when that total fits the pool and the communication buffers fit beside it.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Dict, Optional

from ..model.architecture import LlamaShape, resolve_shape
from ..objectives import of as objective_of
from ..recipe.schema import Recipe
from ..strategies import STRATEGIES, chunked_ce, lora, offload, parallel, precision, recompute
from ..strategies.accumulation import accumulates
from ..common.jit_level import GE, default_backend
from .devices import GB, MB, Device, get_device
from .int8_weights import dequantized_weight_bytes, int8_layer_bytes

MARGIN_FRACTION = 0.10
# Each HCCL communicator's send and receive buffers: 2 x HCCL_BUFFSIZE, default 200 MB
# (HCCL_COMM_DEFAULT_BUFFSIZE, CANN hccl_types.h; MindSpore's collective/utils.cc
# GetHcclBufferSize), allocated by HCCL outside MindSpore's memory pool.
HCCL_BUFFER = 2 * 200 * MB
ALLREDUCE_BUCKET = 64 * 2**20  # MindSpore's default all-reduce fusion threshold (set_fusion_threshold_mb)
PHASES = ("forward", "backward", "update")


@dataclass(frozen=True)
class Strategy:
    """The settings an estimate assumes (a flat view of the recipe's relevant keys)."""
    seq_len: int
    micro_batch: int
    global_batch: int
    amp_level: str = "O2"
    dtype: str = "float16"
    optimizer: str = "adamw"
    lora: bool = False
    lora_rank: int = 8
    lora_targets: tuple = ("wq", "wk", "wv", "wo")
    lora_base_dtype: str = "compute"  # compute | int8: the frozen base's linear weights (memory/int8_weights.py)
    recompute: str = "none"  # none | selective | full
    recompute_layers: int = 0  # full: first N layers (0 = all)
    chunked_ce: bool = False
    chunk_size: int = 1024
    flash_attention: bool = True
    data: int = 1
    model: int = 1
    pipeline: int = 1
    optimizer_shard: bool = False
    sequence_parallel: bool = False
    vocab_emb_dp: bool = True
    # The objective's terms (objectives/ plan_settings). Rows a sample is: 2 for a DPO pair
    # (its chosen and rejected reply run in one forward pass), whose micro_batch and
    # global_batch count pairs. A sample of several rows keeps them on one card, so its loss
    # splits only the batch axis: no model or pipeline parallel.
    sequences_per_sample: int = 1
    # dpo.reference adapters_off: a forward without gradients before the policy's, each micro-step.
    reference_forward: bool = False
    offload: bool = False  # strategies.offload.optimizer host: master, moments, accumulators and update on the host

    @property
    def devices(self) -> int:
        return self.data * self.model * self.pipeline

    @property
    def rows(self) -> int:
        """Sequences of one micro-batch: what its activations and logits scale with."""
        return self.micro_batch * self.sequences_per_sample

    @property
    def accumulation(self) -> int:
        return max(self.global_batch // (self.micro_batch * self.data), 1)


@dataclass
class Plan:
    params: int
    device: Device
    strategy: Strategy
    components: Dict[str, int] = field(default_factory=dict)
    phases: Dict[str, int] = field(default_factory=dict)  # bytes alive at each phase's peak, margin excluded
    host: Dict[str, int] = field(default_factory=dict)  # host bytes one rank holds (strategies.offload)
    shape: Optional[LlamaShape] = None  # a training plan's model (memory/step_time.py reads it)

    @property
    def peak_phase(self) -> Optional[str]:
        return max(self.phases, key=self.phases.get) if self.phases else None

    @property
    def total_bytes(self) -> int:
        if not self.phases:  # inference: one forward pass, everything alive at once
            return sum(self.components.values())
        return self.phases[self.peak_phase] + self.components["margin"]

    @property
    def outside_pool_bytes(self) -> int:
        """What the HBM holds outside MindSpore's pool beside the runtime: HCCL's buffers."""
        return self.components.get("communication_buffers", 0)

    @property
    def fits(self) -> bool:
        room = self.device.hbm_bytes - self.device.usable_bytes
        return self.total_bytes <= self.device.usable_bytes and self.outside_pool_bytes <= room


def split_params(shape: LlamaShape) -> dict:
    """Parameters by where they live; their sum is the model's exact count (tested)."""
    h, f, kv = shape.hidden_size, shape.intermediate_size, shape.num_kv_heads * shape.head_dim
    return {"embedding": shape.vocab_size * h,
            "layer_matrices": 2 * h * h + 2 * h * kv + 3 * h * f,
            "layer_norms": 2 * h, "final_norm": h}


def parameter_total(shape: LlamaShape) -> int:
    """The model's parameter count from its shape alone, without MindSpore: split_params over
    every layer (equal to the built model's, tests/test_planner.py)."""
    split = split_params(shape)
    return split["embedding"] + shape.num_layers * (split["layer_matrices"] + split["layer_norms"]) \
        + split["final_norm"]


def host_bytes(recipe: Recipe) -> int:
    """Host memory one rank of `recipe` holds for the optimizer on the host (0 without it):
    what train's pre-flight compares with the node's MemAvailable."""
    s = strategy_from_recipe(recipe, recipe.device.name)
    if not offload.planned_on_host(s):
        return 0
    shape = resolve_shape(recipe.model)
    return sum(host_states(shape, parameter_total(shape), s).values())


def host_states(shape: LlamaShape, params: int, s: Strategy) -> Dict[str, int]:
    """strategies.offload's host side of a plan; the largest tensor in flight is the embedding."""
    return offload.host_states(params, s, split_params(shape)["embedding"], precision.activation_bytes(s))


def int8_base(s: Strategy) -> bool:
    """LoRA over a base whose linear weights are held in int8 (strategies.lora.base_dtype)."""
    return s.lora and s.lora_base_dtype == "int8"


def model_states(shape: LlamaShape, s: Strategy) -> Dict[str, int]:
    split = split_params(shape)
    layers = parallel.layers_on_device(shape, s)
    emb = split["embedding"] // parallel.vocab_split(s)
    on_device = layers * (split["layer_matrices"] // s.model + split["layer_norms"]) + emb + split["final_norm"]
    trainable = lora.trainable_params(shape, s, layers, on_device)
    if offload.planned_on_host(s):  # full fine-tuning without model or pipeline stages (offload.check)
        norms = layers * split["layer_norms"] + split["final_norm"]
        return offload.card_states(on_device, norms, precision.activation_bytes(s))
    weights, copies = precision.weight_bytes(s, on_device, trainable, frozen=s.lora)
    if int8_base(s):  # the base's linear weights in int8 + scales, the rest in the compute dtype
        linear = layers * split["layer_matrices"]
        weights += layers * int8_layer_bytes(shape) - linear * precision.activation_bytes(s)
    grad_bytes = precision.gradient_bytes(s, frozen=s.lora, accumulates=accumulates(s))
    # What the backward produces, in the trainable parameters' dtype, before it is accumulated.
    produced = trainable * precision.gradient_bytes(s, frozen=s.lora, accumulates=False)
    return {"weights": weights, "weight_compute_copies": copies, "gradients": trainable * grad_bytes,
            "micro_batch_gradients": produced if accumulates(s) else 0,
            "optimizer_states": trainable * 8 // parallel.optimizer_split(s)}


def layer_activations(shape: LlamaShape, s: Strategy) -> int:
    """Bytes one decoder layer keeps for the backward pass for one micro-batch."""
    c = precision.activation_bytes(s)
    b, t = s.rows, s.seq_len
    tokens = b * t
    h, f, a = shape.hidden_size, shape.intermediate_size, shape.num_heads
    kv = shape.num_kv_heads * shape.head_dim
    norms = 4 * tokens * h * c // parallel.norm_split(s)  # both norms' inputs and outputs
    qkv = tokens * (h + 2 * kv) * c + tokens * (h + kv) * c  # projections and their rotated q, k
    attention_out = tokens * h * c
    repeated_kv = tokens * 2 * h * c
    if s.flash_attention:
        scores = b * a * t * 8  # flash attention keeps only softmax statistics
    else:
        scores = b * a * t * t * (4 + c) + repeated_kv  # fp32 probabilities, their cast, repeated k/v
    mlp = 4 * tokens * f * c  # gate, up, silu(gate), product
    mlp, scores = recompute.selective_kept(s, mlp, scores, repeated_kv)
    return norms + (qkv + attention_out + scores + mlp) // s.model


def activations(shape: LlamaShape, s: Strategy) -> int:
    layers = parallel.layers_on_device(shape, s)
    layer_input = s.rows * s.seq_len * shape.hidden_size * precision.activation_bytes(s)
    kept = recompute.kept_activations(s, layers, layer_activations(shape, s), layer_input)
    return kept * parallel.micro_batches_in_flight(s) + 2 * layer_input  # + embedding output and final norm


def logits_loss(shape: LlamaShape, s: Strategy) -> int:
    tokens = s.rows * s.seq_len
    vocab = shape.vocab_size // parallel.vocab_split(s)
    # head output in the compute dtype, its fp32 cast, exp/softmax and the gradient of the logits
    buffers = chunked_ce.logits_rows(s, tokens) * vocab * (precision.activation_bytes(s) + 12)
    return buffers + chunked_ce.hidden_gradient(s, tokens, shape.hidden_size)


def reference_forward(shape: LlamaShape, s: Strategy) -> int:
    """The adapters-off reference forward's peak beside the model states: it keeps nothing for
    a backward, so one layer's activations (as if not recomputed) at a time, its input and
    output, and the head's output, fp32 cast and exp (or one chunk's) with no logits' gradient."""
    tokens = s.rows * s.seq_len
    layer_input = tokens * shape.hidden_size * precision.activation_bytes(s)
    one_layer = layer_activations(shape, replace(s, recompute="none"))
    vocab = shape.vocab_size // parallel.vocab_split(s)
    head = chunked_ce.logits_rows(s, tokens) * vocab * (precision.activation_bytes(s) + 8)
    return one_layer + 2 * layer_input + head


def step_transients(shape: LlamaShape, s: Strategy, device: Device) -> Dict[str, int]:
    """The gradients in flight in the backward and the update's own copies (module docstring)."""
    embedding = 0 if s.lora else split_params(shape)["embedding"] // parallel.vocab_split(s) * 4
    # The largest gradient a one-at-a-time copy holds: the embedding's, or a layer's adapters.
    largest = embedding or 4 * lora.lora_params_per_layer(shape, s.lora_rank, s.lora_targets)
    gradients = model_states(shape, s)["gradients"]
    if parallel.is_sharded(s):
        update = gradients if accumulates(s) else largest
    else:
        update = max(ALLREDUCE_BUCKET, largest) if s.data > 1 else 0
        if offload.planned_on_host(s):  # the host unscales and clips, in its own memory
            update += offload.exchange_bytes(model_states(shape, s)["weights"], s)
        else:
            update += precision.scaling_copies(s, frozen=s.lora, accumulates=accumulates(s), gradients=gradients,
                                               largest=largest // 4, out_of_place=scales_out_of_place(device))
    update += precision.half_update_copy(s, frozen=s.lora, accumulates=accumulates_on_card(s), gradients=gradients)
    transients = {"embedding_gradient": embedding, "update_copies": update}
    if int8_base(s):
        transients["dequantized_weight"] = dequantized_weight_bytes(shape, precision.activation_bytes(s),
                                                                    s.flash_attention)
    return transients


def scales_out_of_place(device: Device) -> bool:
    """Whether our train step unscales and clips into new tensors on `device`: where it compiles for GE."""
    return default_backend(device.name) == GE


def accumulates_on_card(s: Strategy) -> bool:
    """Whether the card keeps gradient accumulators across micro-batches: not when they are on the host."""
    return accumulates(s) and not offload.planned_on_host(s)


def phase_terms(components: Dict[str, int], s: Strategy) -> Dict[str, Dict[str, int]]:
    """The components alive at the peak of each phase of one micro-step, with the bytes each
    holds there (docs/memory.md); a phase's peak is their sum (phase_peaks)."""
    c = components
    accumulating = accumulates_on_card(s)
    # The communication buffers are outside the pool (Plan.fits checks them there).
    always = {"weights": c["weights"], "optimizer_states": c["optimizer_states"],
              "gradients": c["gradients"] if accumulating else 0}
    # An int8 base's dequantized weight: one at a time, in the forward and again in the backward.
    dequantized = {"dequantized_weight": c.get("dequantized_weight", 0)}
    forward = {**always, "weight_compute_copies": c["weight_compute_copies"], "activations": c["activations"],
               "logits_loss": c["logits_loss"], **dequantized}
    # Start of the backward: every activation, the logits' gradient and the head's weight
    # gradient (chunked CE: the copies its backward holds). Its end: the micro-batch's
    # gradients (k = 1), or, accumulating, the accumulators and a whole micro-batch's
    # gradients not yet added in (the worst case, module docstring); beside them the rows'
    # out-of-place sum, or the sharded wrappers' two dense parts of the embedding gradient.
    start = {**forward, "embedding_gradient": chunked_ce.head_gradient_copies(s) * c["embedding_gradient"]}
    dense_parts = 2 if parallel.is_sharded(s) else 1
    end = {**always, "weight_compute_copies": c["weight_compute_copies"],
           **({"micro_batch_gradients": c["micro_batch_gradients"]} if accumulating else {"gradients": c["gradients"]}),
           "embedding_gradient": dense_parts * c["embedding_gradient"], **dequantized}
    terms = {"forward": forward, "backward": max(start, end, key=lambda t: sum(t.values())),
             "update": {**always, "gradients": c["gradients"], "update_copies": c["update_copies"]}}
    if "reference_forward" in c:  # before the policy's forward: its buffers are freed by then
        terms["reference"] = {**always, "weight_compute_copies": c["weight_compute_copies"],
                              "reference_forward": c["reference_forward"], **dequantized}
    return {phase: {name: n for name, n in alive.items() if n} for phase, alive in terms.items()}


def phase_peaks(components: Dict[str, int], s: Strategy) -> Dict[str, int]:
    """Bytes alive at the peak of each phase of one micro-step."""
    return {phase: sum(alive.values()) for phase, alive in phase_terms(components, s).items()}


def strategy_from_recipe(recipe: Recipe, device_name: str) -> Strategy:
    """The recipe's settings as a Strategy: the sequence, the micro-batch and the optimizer,
    and each strategy's own keys. A DPO run's micro-batch of P pairs is 2P rows. Its reference
    keeps no second model: dpo.reference precomputed's pass before step 1
    (training/reference_pass.py) is a forward of the same rows without gradients or optimizer
    states (built after it), below the training step's forward phase; adapters_off's forward
    runs in every micro-step, beside the optimizer states: its own phase (reference_forward)."""
    settings = {key: value for strategy in STRATEGIES for key, value in strategy.plan_settings(recipe).items()}
    return Strategy(seq_len=recipe.data.max_seq_len, micro_batch=recipe.train.micro_batch_size,
                    optimizer=recipe.train.optimizer.name, flash_attention=get_device(device_name).flash_attention,
                    **settings, **objective_of(recipe).plan_settings(recipe))


def estimate(shape: LlamaShape, params: int, device: Device, s: Strategy) -> Plan:
    if not device.flash_attention:  # the model is built without it there (model.fused_kernels)
        s = replace(s, flash_attention=False)
    plan = Plan(params, device, s, shape=shape)
    plan.components.update(model_states(shape, s))
    plan.components["activations"] = activations(shape, s)
    plan.components["logits_loss"] = logits_loss(shape, s)
    plan.components.update(step_transients(shape, s, device))
    if s.reference_forward:
        plan.components["reference_forward"] = reference_forward(shape, s)
    # HCCL is Ascend's; the CPU backend's collectives keep no such buffers.
    hccl = 0 if device.name == "cpu" else HCCL_BUFFER
    plan.components["communication_buffers"] = parallel.communicators(s) * hccl
    plan.components["margin"] = math.ceil(device.usable_bytes * MARGIN_FRACTION)
    plan.phases = phase_peaks(plan.components, s)
    if offload.planned_on_host(s):  # full fine-tuning, on the layouts offload.check allows
        plan.host = host_states(shape, params, s)
    return plan


def fit(shape: LlamaShape, params: int, device: Device, base: Strategy, devices: int, allow_lora: bool,
        rank, allow_offload: bool = True) -> tuple[Optional[Plan], Plan]:
    """(best plan that fits or None, closest plan overall) over micro-batch, accumulation
    (the global batch kept), recompute, chunked cross-entropy, precision, LoRA, the optimizer
    on the host, and layouts; `rank(plan)`: the key the best plan maximises
    (memory/fit_choice.py rank_key)."""
    half = "bfloat16" if device.bf16 else "float16"
    precisions = [("O2", half)] if device.name != "cpu" else [("O0", "float16"), ("O2", "float16")]
    best, closest = None, None
    for (data, model, pipeline), shard, micro, recompute_mode, chunked, (amp, dtype), (with_lora, base_dtype), \
            on_host in itertools.product(parallel.layouts(shape, devices), (False, True), (1, 2, 4, 8, 16),
                                         ("none", "selective", "full"), (False, True), precisions,
                                         lora_choices(base, allow_lora), offload_choices(base, allow_offload)):
        if shard and data == 1:
            continue
        if on_host and (with_lora or not offload.planned_layout_supported(data, model, pipeline, shard)):
            continue  # the host update trains every parameter, on the layouts strategies/offload.py check allows
        if base.reference_forward and not with_lora:
            continue  # an adapters-off reference is the LoRA policy's own base
        if (base.sequences_per_sample > 1 and (model > 1 or pipeline > 1)) or (shard and base.reference_forward):
            continue  # layouts the objective's check refuses (DPO: objectives/dpo/section.py)
        if base_dtype == "int8" and model > 1:
            continue  # the int8 base is not sharded (strategies/lora.py refuses it)
        if chunked and (shard or model > 1 or pipeline > 1):
            continue  # sharded layouts use MindFormers' loss; recipe validation refuses chunked CE there
        if base.global_batch % (micro * data):
            continue
        accumulation = base.global_batch // (micro * data)
        if pipeline > 1 and accumulation < pipeline:
            continue
        s = replace(base, data=data, model=model, pipeline=pipeline, optimizer_shard=shard, micro_batch=micro,
                    recompute=recompute_mode, recompute_layers=0, chunked_ce=chunked, amp_level=amp, dtype=dtype,
                    lora=with_lora, lora_base_dtype=base_dtype, sequence_parallel=base.sequence_parallel and model > 1,
                    flash_attention=device.flash_attention, offload=on_host)
        plan = estimate(shape, params, device, s)
        if closest is None or plan.total_bytes < closest.total_bytes:
            closest = plan
        if plan.fits and (best is None or rank(plan) > rank(best)):
            best = plan
    return best, closest


def lora_choices(base: Strategy, allow_lora: bool) -> list:
    """(LoRA, base dtype) pairs --fit tries: full fine-tuning, and LoRA over a base held in the
    compute dtype or in int8; the recipe's own choice when LoRA may not be switched."""
    if not allow_lora:
        return [(base.lora, base.lora_base_dtype if base.lora else "compute")]
    return [(False, "compute"), (True, "compute"), (True, "int8")]


def offload_choices(base: Strategy, allow_offload: bool) -> tuple:
    """Where --fit tries the optimizer: on the card, and for AdamW also on the host; the
    recipe's own place when it may not be switched (--no-offload)."""
    if not allow_offload:
        return (base.offload,)
    return (False, True) if base.optimizer == "adamw" else (False,)


INFERENCE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}


def estimate_inference(shape: LlamaShape, params: int, device: Device, precision: str, batch: int,
                       seq_len: int) -> Plan:
    """Serving one forward pass over batch x seq_len tokens with a KV cache of that length.
    INT8: per-output-channel symmetric weights for the decoder's linear layers, one fp32
    scale per output channel, one weight dequantized at a time; embeddings and norms stay in
    fp16."""
    split = split_params(shape)
    w = INFERENCE_BYTES[precision]
    c = 4 if precision == "fp32" else 2  # activations and KV cache: fp32, else the half dtype
    layers = shape.num_layers
    kv = shape.num_kv_heads * shape.head_dim
    if precision == "int8":
        weights = layers * int8_layer_bytes(shape) \
            + (split["embedding"] + layers * split["layer_norms"] + split["final_norm"]) * 2
    else:
        weights = params * w
    tokens = batch * seq_len
    one_layer = tokens * (4 * shape.hidden_size + 2 * kv + 3 * shape.intermediate_size) * c \
        + batch * shape.num_heads * seq_len * seq_len * 4  # working set of one layer, scores in fp32
    s = Strategy(seq_len=seq_len, micro_batch=batch, global_batch=batch, amp_level="O0" if c == 4 else "O2",
                 optimizer="none", flash_attention=False)
    plan = Plan(params, device, s)
    plan.components.update({
        "weights": weights, "weight_compute_copies": 0, "gradients": 0, "micro_batch_gradients": 0,
        "optimizer_states": 0,
        "kv_cache": 2 * layers * tokens * kv * c, "activations": one_layer,
        "logits_loss": tokens * shape.vocab_size * 4,
        # held in int8, each weight is dequantized right before its matmul, a block at a time
        "dequantized_weight": dequantized_weight_bytes(shape, c, device.flash_attention, forward_only=True)
        if precision == "int8" else 0,
        "communication_buffers": 0, "margin": math.ceil(device.usable_bytes * MARGIN_FRACTION)})
    return plan


def fit_inference(shape: LlamaShape, params: int, device: Device, precision: str, batch: int,
                  seq_len: int) -> tuple[Optional[tuple], tuple]:
    """((precision, plan) of the most precise weights that fit, or None; the last one tried):
    `precision`, then the device's half precision, then int8, each at the given batch and length."""
    order = ["fp32", "bf16" if device.bf16 and precision != "fp16" else "fp16", "int8"]
    tried = order[order.index(precision):]  # bf16 on a device without it is refused before
    plan = None
    for name in tried:
        plan = estimate_inference(shape, params, device, name, batch, seq_len)
        if plan.fits:
            return (name, plan), (name, plan)
    return None, (tried[-1], plan)


def gb(n: int) -> str:
    return f"{n / GB:.2f}"
