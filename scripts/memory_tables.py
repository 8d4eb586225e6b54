"""Write docs/memory.md and docs/memory.zh-CN.md from the planner's numbers.

    .venv/bin/python scripts/memory_tables.py          # rewrite both files
    .venv/bin/python scripts/memory_tables.py --check  # exit 1 if they are out of date (tests use it)
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from llama_npu.memory.devices import DEVICES, GB  # noqa: E402
from llama_npu.memory.parameter_count import cached_parameter_count  # noqa: E402
from llama_npu.memory.int8_weights import int8_layer_bytes  # noqa: E402
from llama_npu.memory.planner import Strategy, estimate, estimate_inference, host_states, split_params  # noqa: E402
from llama_npu.model.architecture import PRESETS  # noqa: E402

MODELS = ("llama3.2-1b", "llama3.2-3b")


def g(n: int) -> str:
    return f"{n / GB:.2f}"


def inference_rows():
    rows = []
    for name in MODELS:
        shape, params = PRESETS[name], cached_parameter_count(PRESETS[name])
        for precision in ("fp32", "fp16", "int8"):
            c = estimate_inference(shape, params, DEVICES["910a"], precision, 1, 512).components
            work = c["activations"] + c["logits_loss"] + c["dequantized_weight"]
            rows.append(f"| {name} | {params:,} | {precision} | {g(c['weights'])} | {g(c['kv_cache'])} | "
                        f"{g(work)} | {g(c['weights'] + c['kv_cache'] + work)} |")
    return rows


USUAL_INT8 = {"llama3.2-1b": 1.2, "llama3.2-3b": 3.6}  # the users' guides' INT8 inference figures, GB as they print it


def usual_int8_rows():
    """The guides' INT8 inference figure beside the planner's, term by term (batch 1, 512 tokens)."""
    rows = []
    for name in MODELS:
        shape, params = PRESETS[name], cached_parameter_count(PRESETS[name])
        c = estimate_inference(shape, params, DEVICES["910a"], "int8", 1, 512).components
        matrices = shape.num_layers * split_params(shape)["layer_matrices"]
        rest = params - matrices  # the embedding and the norms: their second byte in fp16
        scales = shape.num_layers * int8_layer_bytes(shape) - matrices
        work = c["kv_cache"] + c["activations"] + c["logits_loss"] + c["dequantized_weight"]
        assert c["weights"] == params + rest + scales  # the columns add up to the planner's total
        rows.append(f"| {name} | {USUAL_INT8[name]} | {g(params)} | {g(rest)} | {scales / 2**20:.1f} MB | {g(work)} | "
                    f"{g(c['weights'] + work)} |")
    return rows


TRAINING = [  # (label, strategy changes)
    ("FP32 (O0), micro-batch 4", dict(amp_level="O0", micro_batch=4, global_batch=4)),
    ("FP16 (O2), micro-batch 4", dict(amp_level="O2", micro_batch=4, global_batch=4)),
    ("FP16, micro-batch 1 x 4 accumulated", dict(amp_level="O2", micro_batch=1, global_batch=4)),
    ("+ full recompute", dict(amp_level="O2", micro_batch=1, global_batch=4, recompute="full")),
    ("+ model parallel 2 (per card of 2)", dict(amp_level="O2", micro_batch=1, global_batch=4, recompute="full",
                                               model=2)),
]


LORA = [  # (label, strategy changes): LoRA rank 8 on wq wk wv wo, FP16 (O2)
    ("LoRA, FP16 base, micro-batch 4", dict(lora=True, micro_batch=4, global_batch=4)),
    ("LoRA, INT8 base, micro-batch 4", dict(lora=True, lora_base_dtype="int8", micro_batch=4, global_batch=4)),
    ("LoRA, INT8 base, micro-batch 1 x 4 accumulated", dict(lora=True, lora_base_dtype="int8", micro_batch=1,
                                                            global_batch=4)),
]


def training_rows(settings=TRAINING):
    rows = []
    for name in MODELS:
        shape, params = PRESETS[name], cached_parameter_count(PRESETS[name])
        for label, changes in settings:
            s = replace(Strategy(seq_len=512, micro_batch=1, global_batch=1), **changes)
            cells = []
            for device in (DEVICES["910a"], DEVICES["910b"]):  # the 910A runs without flash attention
                plan = estimate(shape, params, device, s)
                need = plan.total_bytes - plan.components["margin"]
                fits = "yes" if need + device.usable_bytes // 10 <= device.usable_bytes else "no"
                cells.append((plan.components, need, fits))
            (c, need_a, fits_a), (c_b, need_b, fits_b) = cells
            states = c["weights"] + c["weight_compute_copies"] + c["gradients"] + c["optimizer_states"] \
                + c.get("dequantized_weight", 0)
            rows.append(f"| {name} | {label} | {g(states)} | {g(c['activations'])} / {g(c_b['activations'])} | "
                        f"{g(c['logits_loss'])} | {g(need_a)} / {g(need_b)} | {fits_a} | {fits_b} |")
    return rows


def facts():
    p1, p3 = (cached_parameter_count(PRESETS[m]) for m in MODELS)
    s = Strategy(seq_len=512, micro_batch=1, global_batch=16, amp_level="O2")
    c3 = estimate(PRESETS["llama3.2-3b"], p3, DEVICES["910a"], s).components
    states3 = c3["weights"] + c3["weight_compute_copies"] + c3["gradients"] + c3["optimizer_states"]
    one_layer = estimate(PRESETS["llama3.2-3b"], p3, DEVICES["910a"], replace(s, micro_batch=1)).components
    return dict(p1=f"{p1:,}", p3=f"{p3:,}", states3=g(states3), adam3=g(c3["optimizer_states"]),
                logits=g(one_layer["logits_loss"]), act=g(one_layer["activations"]))


# What benchmarks/int8_memory.py printed (2026-12-02), quoted by both pages.
INT8_OUTPUT = """eval float32  weights held 4.60 GiB; baseline 0.79 GiB, peak 6.35 GiB, above baseline 5.56 GiB (loss 6265.582)
eval float16  weights held 2.30 GiB; baseline 0.79 GiB, peak 3.49 GiB, above baseline 2.71 GiB (loss 6265.635)
eval int8     weights held 1.40 GiB; baseline 0.79 GiB, peak 2.61 GiB, above baseline 1.82 GiB (loss 6139.764)
planner (estimate_inference, 910A, 1 x 512, without its margin): fp32 weights 4.60 GiB, total 4.98 GiB,
  fp16 weights 2.30 GiB, total 2.63 GiB, int8 weights 1.40 GiB, total 1.74 GiB
planner int8/fp16 total: 0.663
LoRA rank 8 (wq wk wv wo), O2 fp16, 4 of the 1B shape's layers, 1 x 256 tokens, 2 steps, GRAPH_MODE (the train step's):
LoRA over a float16 base: baseline 0.79 GiB, peak 8.74 GiB, resident after the steps 8.74 GiB
LoRA over a int8    base: baseline 0.79 GiB, peak 16.81 GiB, resident after the steps 16.81 GiB
LoRA int8/fp16 base peak above baseline: 2.014; resident after the steps: 1.922
int8/fp16 eval whole-process peak: 0.747
int8/fp16 eval peak above baseline: 0.673"""

EN = """# Memory of Llama 3.2 1B and 3B on Ascend: the planner's numbers

Generated by `scripts/memory_tables.py` from `llama-npu plan`'s formulas (see the README's
"Will it fit?" section); regenerate it after changing the planner. Memory is in GiB, 2^30
bytes, the unit MindSpore calls GB: it reads `max_device_memory: "29GB"` as 29 x 2^30 =
31,138,512,896 bytes. Bandwidths (GB/s) are decimal, 10^9 bytes a second.
Figures are estimates of this harness's memory on an NPU, not measurements.

## Inference, batch 1, 512 tokens

| model | parameters | precision | weights GiB | KV cache GiB | activations + logits GiB | total GiB |
|---|---|---|---|---|---|---|
{inference}

INT8 is per-output-channel symmetric on the decoder's linear layers, with one fp32 scale
per output channel; the embedding (tied to the LM head) and the norms stay in FP16, so INT8
does not quarter the weights: the 128,256 x hidden embedding is a large share of a small model.
Each linear weight is dequantized right before its matmul, 2^21 weights at a time, each
block ordered after the previous block's matmul: on the 910A the INT8 rows' activations
include the FP16 copies of the first blocks of wq, wk and wv, which read one input and which
nothing orders among themselves, and one block's fp32 cast and fp32 product with the scales
(`dequantized_weight`); the 910B's WeightQuantBatchMatmul dequantizes inside the kernel and
forms none.

The usual guides put INT8 inference at about 1.2 GB for the 1B model and 3.6 GB for the 3B.
Beside the planner's count, term by term (GiB):

| model | the guides' figure | 1 byte a parameter | + embedding and norms in FP16 | + fp32 scales | + KV cache, activations, logits, dequantized weight | planner's total |
|---|---|---|---|---|---|---|
{usual_int8}

The 1B figure is the weights alone, every parameter at one byte, a third short of the
total: it leaves out that the embedding is not quantized (the tied LM head would lose the
most from it; it is 21% of the 1B model's parameters), the scales, and everything a forward
pass allocates, first the fp32 logits over the 128,256-token vocabulary. The 3B figure, 1
byte a parameter plus a fifth, comes within 0.2 GiB of the total without naming any of it;
at a longer sequence or a larger batch the work buffers grow and it falls short as the 1B's
does (`llama-npu plan --task inference --precision int8` counts any length).

## Full fine-tuning with AdamW, 512 tokens a sequence

| model | settings | model states GiB | activations GiB 910A / 910B | logits + loss GiB | needs GiB per card 910A / 910B | fits 910A (29 GiB) with 10% free | fits 910B (58 GiB) |
|---|---|---|---|---|---|---|---|
{training}

The 910A runs without flash attention (CANN supports it on Atlas A2/A3 only), so its
activations include every layer's attention scores: fp32 probabilities and their
half-precision cast, micro-batch x heads x tokens². The 910B keeps only flash attention's
softmax statistics.

## LoRA over an FP16 or an INT8 base, 512 tokens a sequence

LoRA rank 8 on wq, wk, wv and wo, AdamW on the adapters, FP16 (O2). With
`strategies.lora.base_dtype: int8` the frozen base's linear weights are held as INT8 with
fp32 scales (as `quantize` writes them), dequantized right before each matmul, in the
forward and again in the backward (after its dout), never shared between two forwards or a
forward and a backward: the model states column includes the worst transient, w1's and
w3's bprops at once, whose douts arrive together (the 910A's; the needs column has each
card's, none on the 910B).

| model | settings | model states GiB | activations GiB 910A / 910B | logits + loss GiB | needs GiB per card 910A / 910B | fits 910A (29 GiB) with 10% free | fits 910B (58 GiB) |
|---|---|---|---|---|---|---|---|
{lora}

## The optimizer on the host (`strategies.offload`)

With `strategies.offload.optimizer: host` (ZeRO-Offload's split, docs/strategies-and-planner.md)
the card keeps the weights in the compute dtype (the RMSNorm gains fp32) and one
micro-batch's gradients in it, sent to the host after each backward; the fp32 master
weights, AdamW's moments and the fp32 accumulators (at k = 1 the fp32 gradients the update
reads) are host memory, 16 bytes a parameter, and the update runs there. The card's phases
lose the master, the moments, the accumulators and the update's scaling copies; `plan` adds a host line: the bytes a rank and a node hold
(each of N data-parallel ranks 1/N), the update's time at `--host-bandwidth` (default
{host_bandwidth:g} GB/s a rank: it reads and writes {update_bytes} bytes a parameter) and the
traffic a step. Under data parallel the card's update phase also holds the whole weights
once more, gathered from every rank's updated range before each matrix takes its slice. The longest sequence a full fine-tune fits, micro-batch 1, one card, O2 in
the card's half precision, any recompute and chunked cross-entropy (`plan --fit --maximize
seq-len`, from 512 tokens):

| model | device | longest, optimizer on the card | longest, optimizer on the host | card GiB at that length | host GiB a rank | host update a step |
|---|---|---|---|---|---|---|
{offload}

"none" means no length fits: the card's states alone exceed it. On the 910B, the 3B's
in-graph states (weights, half copies, gradients, moments: {states_3b} GiB) and the embedding's
gradient leave no room at any length; with the optimizer on the host the activations of the
whole context fit.

## Which tensors are alive in each phase

A plan's total is the largest of the step's three phases plus the 10% margin, not the sum
of its components: the half-precision weight copies and the activations are gone by the
update, and the gradients of a one-micro-batch step do not exist in the forward.

| phase | k = 1 (one micro-batch a step) | k > 1 (accumulating) |
|---|---|---|
| forward | weights, optimizer states, half-precision weight copies, activations, logits + loss | the same + the fp32 accumulators |
| backward, start | the forward's + the LM head's fp32 weight gradient (the tied embedding's); three copies of it with chunked cross-entropy | the same |
| backward, end | weights, states, copies, every gradient + one copy of the embedding's: the lookup's gradient comes back as one row per token and is added into a copy of the head's part | weights, states, copies, accumulators + a whole micro-batch's gradients not yet added in, and the embedding's copy as at k = 1 (the worst case: `micro_batch_gradients`) |
| update | weights, states, gradients: unscaled and clipped in place (910A, O3: into a new set) | weights, states, accumulators: unscaled and clipped in place (910A: into a new set) |

Chunked cross-entropy's backward (model/chunked_loss.py) sums the head's gradient chunk by
chunk out of place: at each chunk's add the previous sum, the chunk's fp32 product and the
new sum are alive, three fp32 copies. At k > 1 nothing in the step orders each gradient's
add right after the backward produces it: MindSpore runs the graph in a topological order
chosen without regard to memory, so the planner counts a whole micro-batch's gradients
beside the accumulators, and `plan --json` says so in its `notes`.

The unscale and clip are in place only where the step compiles kernel by kernel (jit level
O0: the 910B, the CPU). On the 910A MindSpore's default jit level is O2, which sinks the
graph into GE, and GE has no in-place multiply (common/jit_level.py): the step multiplies
into new tensors, and the planner counts a whole new set of gradients in the update, the
worst case, since the graph's order need not free each gradient as its scaled copy is made
(`plan --json` says so in its `notes`). On the 1B full fine-tune that is 4.60 GiB more in the
update, which stays below the backward's peak. O3's half gradients are multiplied in fp32
one at a time and cast back (no fp16 underflow of the factor): a new half set, and the
largest gradient's fp32 cast and product in flight (1.96 GiB for the 1B's embedding).

With data parallel, HCCL keeps 2 x 200 MB (2 x HCCL_BUFFSIZE) per communicator outside
MindSpore's pool: `plan` checks they fit in the HBM the pool leaves (32 GiB - 29 GiB on a
910A) and counts them in no phase. The update holds the all-reduce's output, one fusion
bucket at a time (MindSpore's 64 MB threshold, or the largest gradient, the embedding's),
which k > 1 copies back into the accumulators. The
sharded layouts (model / pipeline parallel, optimizer sharding) use MindFormers' wrappers,
whose accumulating variant scales the accumulators out of place
(`MFPipelineWithLossScaleCell`, mindformers/wrapper/wrapper.py): a full fp32 set more in
the update, and autodiff's dense lookup gradient and the sum of the two parts at the
backward's end (two embedding-sized fp32 tensors more). `tests/test_strategies.py` counts
the embedding-sized fp32 tensors in the compiled train step's graph: the head's gradient
and the optimizer's, nothing else.

The shipped 910A recipes, phase by phase (GiB, the margin excluded):

| recipe | forward | backward | update | peak | spare beyond the margin |
|---|---|---|---|---|---|
{phases}

## Where the usual figures go wrong

1. "1B" and "3B" are rounded: the models have {p1} and {p3} parameters, and every
   bytes-per-parameter figure scales with the real count.
2. The 3B model's hidden size is 3072 (28 layers, 24 heads, 8 KV heads), not 2560.
3. Mixed precision does not halve model states: fp32 master weights (4 bytes), the FP16
   copies the matmuls use (2), fp32 gradients (4) and AdamW's two fp32 moments (8) stay. For
   the 3B model that is {states3} GiB before a single activation; AdamW's moments alone are
   {adam3} GiB.
4. Gradient accumulation shrinks activations, never model states: "3B full fine-tuning in
   FP16 with accumulation under 10 GB" is impossible on one card. Sharding (optimizer
   sharding across data parallel, model parallel) or LoRA is what fits it.
5. Activation estimates that leave out the number of layers, or the logits, are wrong by an
   order of magnitude: with a 128,256-token vocabulary the logits and the loss of one
   512-token sequence take {logits} GiB, against {act} GiB for all 28 layers' activations.

## INT8 at run time

`benchmarks/int8_memory.py` measures what holding the weights in int8 saves (`eval`/`generate` with
`--weights`, LoRA's `strategies.lora.base_dtype: int8`; [Evaluation and export](evaluation-and-export.md)). It
builds the real 1B shape (hidden 2048, 16 layers, the full vocabulary) with random weights and runs one eval
forward of 1 x 512 tokens through eval's own cells, with the weights held in float32, float16 and int8, each in
its own child process, in PYNATIVE_MODE (the CPU backend frees a kernel's transient buffers there; a
GRAPH_MODE graph keeps every buffer it allocates). Each child records its baseline (VmHWM after the imports and
the tokenizer load, before the model is built) and its peak. Host memory on MindSpore's CPU backend, not NPU
memory. What it printed on this machine (2 cores, shared, 2026-12-02):

```
{int8_output}
```

The weights held match the planner's weight figures exactly (int8: 1 byte a linear weight plus its fp32
scales, the embedding and norms in fp16). The int8/fp16 eval peak above baseline is 1.82 / 2.71 = 0.673, beside
the planner's 0.663 for the same shape on the 910A (whose int8 layers run the same cast-and-scale kernel); the
whole-process ratio, 0.747, carries the 0.79 GiB import baseline. The transients above the weights held are
about 0.4 GiB in the fp16 and int8 children: eval's int8 layers dequantize 2^21 weights at a time (8 MB in
fp32, where the 1B's MLP weight is 67 MB), and the chunked LM head casts a head held in fp16 8,192 vocabulary
rows at a time, carrying the log-sum-exp across blocks, so that neither holds an fp32 copy of a whole matrix
(before that, the head's fp32 copy of the fp16 embedding, 1.05 GiB a chunk, kept the ratio at 0.885). The
fp32 child computes its logits in one piece, as it always has (nothing to cast).

LoRA training is the other way round on this backend: the train step runs in GRAPH_MODE (its PyNative step
stops on MindSpore 2.9.0's CPU backend, fp16 base too), and a GRAPH_MODE graph on the CPU keeps every buffer it
allocates, so every dequantized weight the int8 base forms, in the forward and again in the backward, stays
allocated: 2.0 times the fp16 base's peak above baseline. The planner counts the int8 base as it behaves under
a graph memory planner that reuses one layer's transient for the next, as Ascend's does (not measured here:
no card); on the CPU, use the int8 base to check a recipe, not to save host memory.
"""

ZH = """# Llama 3.2 1B / 3B 在昇腾上的显存：规划器给出的数字

本文由 `scripts/memory_tables.py` 根据 `llama-npu plan` 的公式生成（见 README 的 "Will it fit?" 一节）；
修改规划器后请重新生成。内存以 GiB（2^30 字节）为单位，即 MindSpore 所说的 GB：它把 `max_device_memory: "29GB"` 读作
29 × 2^30 = 31,138,512,896 字节；带宽（GB/s）为十进制，每秒 10^9 字节。数字是本框架在 NPU 上的显存估算，不是实测。

## 推理：batch 1，512 个 token

| 模型 | 参数量 | 精度 | 权重 GiB | KV cache GiB | 激活 + logits GiB | 合计 GiB |
|---|---|---|---|---|---|---|
{inference}

INT8 对解码层的线性层做逐输出通道对称量化，每个输出通道一个 fp32 缩放因子；词嵌入（与 LM head 共享）
和归一化层保持 FP16，因此 INT8 不会把权重降到四分之一：128,256 × hidden 的词嵌入在小模型里占比很大。
每个线性层的权重在其矩阵乘法之前才反量化，每次 2^21 个权重，每一块都排在前一块的矩阵乘法之后：在 910A 上，INT8 行的激活
包含 wq、wk、wv 第一块的 FP16 副本（它们读同一个输入，彼此之间没有先后约束），以及一块的 fp32 转换和它与缩放因子的 fp32
乘积（`dequantized_weight`）；910B 的 WeightQuantBatchMatmul 在算子内部反量化，不生成这些副本。

常见指南给出的 INT8 推理显存：1B 约 1.2 GB，3B 约 3.6 GB。与规划器的数字逐项对照（GiB）：

| 模型 | 指南的数字 | 每参数 1 字节 | + FP16 的词嵌入和归一化层 | + fp32 缩放因子 | + KV cache、激活、logits、反量化权重 | 规划器合计 |
|---|---|---|---|---|---|---|
{usual_int8}

1B 的数字只是权重本身、每个参数按一字节计，比合计少三分之一：它漏掉了词嵌入不量化这一点（与之共享的 LM head
受量化影响最大；词嵌入占 1B 模型参数的 21%）、缩放因子，以及前向计算分配的一切，首先是 128,256 个词的 fp32 logits。
3B 的数字是每参数 1 字节再加五分之一，与合计相差不到 0.2 GiB，却没有说明其中包含什么；序列更长或 batch 更大时
工作缓冲区随之增长，它就会像 1B 的数字一样偏低（`llama-npu plan --task inference --precision int8` 可计算任意长度）。

## AdamW 全参数微调，每条序列 512 个 token

| 模型 | 设置 | 模型状态 GiB | 激活 GiB 910A / 910B | logits + loss GiB | 每卡需要 GiB 910A / 910B | 910A（29 GiB，留 10%）放得下 | 910B（58 GiB）放得下 |
|---|---|---|---|---|---|---|---|
{training}

910A 上不使用 flash attention（CANN 只在 Atlas A2/A3 上支持），因此激活包含每层的注意力分数：fp32 概率及其
半精度副本，micro-batch × 头数 × token²。910B 只保留 flash attention 的 softmax 统计量。

## 在 FP16 或 INT8 基座上做 LoRA，每条序列 512 个 token

LoRA rank 8，作用于 wq、wk、wv、wo，AdamW 只更新适配器，FP16（O2）。设置 `strategies.lora.base_dtype: int8`
时，冻结基座的线性层权重以 INT8 加 fp32 缩放因子保存（与 `quantize` 写出的相同），在每次矩阵乘法之前才反量化，
前向一次、反向再一次（在 dout 之后），两次前向之间、前向与反向之间都不共用：模型状态一列包含最坏的临时张量，即 w1 和 w3
的反向同时进行（它们的 dout 同时到达）（910A 的；"每卡需要"一列按各自的卡计算，910B 上没有）。

| 模型 | 设置 | 模型状态 GiB | 激活 GiB 910A / 910B | logits + loss GiB | 每卡需要 GiB 910A / 910B | 910A（29 GiB，留 10%）放得下 | 910B（58 GiB）放得下 |
|---|---|---|---|---|---|---|---|
{lora}

## 优化器放在主机上（`strategies.offload`）

设置 `strategies.offload.optimizer: host`（ZeRO-Offload 的划分，见 docs/strategies-and-planner.zh-CN.md）时，
卡上只保留计算精度的权重（RMSNorm 的增益仍为 fp32）和一个 micro-batch 的同精度梯度，每次反向结束后送往主机；
fp32 主权重、AdamW 的两个矩以及 fp32 累加器（k = 1 时即更新读取的 fp32 梯度）都在主机内存里，每个参数 16 字节，更新也在主机上运行。卡上各阶段不再有主权重、
矩、累加器和更新时的缩放副本；`plan` 多出一行主机信息：每个 rank 和每个节点占用的字节（N 个数据并行 rank
各持 1/N）、按 `--host-bandwidth`（默认每个 rank {host_bandwidth:g} GB/s；每个参数读写 {update_bytes} 字节）计算的
更新耗时，以及每步的传输量。数据并行时，卡在更新阶段还要多保存一份完整的权重：
它由各 rank 更新后的段 gather 而成，然后每个矩阵取走自己的切片。全参数微调能放下的最长序列（micro-batch 1，单卡，O2 用卡的半精度，任意重计算与
分块交叉熵；`plan --fit --maximize seq-len`，从 512 个 token 起）：

| 模型 | 设备 | 最长序列，优化器在卡上 | 最长序列，优化器在主机上 | 该长度下卡上 GiB | 每 rank 主机 GiB | 每步主机更新 |
|---|---|---|---|---|---|---|
{offload}

"none" 表示任何长度都放不下：仅卡上的状态就已超出。在 910B 上，3B 在图内的状态（权重、半精度副本、梯度、
矩：{states_3b} GiB）加上嵌入层梯度，任何长度都没有空间；优化器放到主机上之后，整个上下文的激活都放得下。

## 各阶段存活的张量

规划的总量是训练步三个阶段中最大的一个再加 10% 余量，而不是各部分之和：半精度权重副本和激活在更新阶段已经释放，
每步只有一个 micro-batch 时，前向阶段还没有梯度。

| 阶段 | k = 1（每步一个 micro-batch） | k > 1（梯度累积） |
|---|---|---|
| 前向 | 权重、优化器状态、半精度权重副本、激活、logits + loss | 同左 + fp32 累积缓冲区 |
| 反向开始 | 前向的全部 + LM head 的 fp32 权重梯度（即共享的词嵌入的梯度）；分块交叉熵时为它的三份副本 | 同左 |
| 反向结束 | 权重、状态、副本、全部梯度 + 词嵌入梯度的一份副本：查表的梯度按每个 token 一行返回，加到 head 那部分的副本中 | 权重、状态、副本、累积缓冲区 + 一整个 micro-batch 尚未加进去的梯度，以及与 k = 1 相同的词嵌入副本（最坏情况：`micro_batch_gradients`） |
| 更新 | 权重、状态、梯度：就地反缩放和裁剪（910A、O3：写入新的一份） | 权重、状态、累积缓冲区：就地反缩放和裁剪（910A：写入新的一份） |

分块交叉熵的反向（model/chunked_loss.py）逐块非就地地累加 head 的梯度：每块相加时，之前的和、该块的 fp32 乘积和
新的和同时存活，共三份 fp32 副本。k > 1 时，训练步中没有任何东西保证每个梯度一产生就加进累积缓冲区：MindSpore
按不考虑显存的拓扑顺序执行计算图，因此规划器把一整个 micro-batch 的梯度与累积缓冲区一起计入，`plan --json`
在 `notes` 中说明这一点。

只有逐算子执行（jit level O0：910B、CPU）时反缩放和裁剪才是就地的。910A 上 MindSpore 默认的 jit level 是 O2，
整图下沉到 GE，而 GE 没有就地乘法（common/jit_level.py）：训练步把乘积写入新的张量，规划器在更新阶段计入一整份
新的梯度，这是最坏情况，因为计算图的执行顺序不保证每个梯度在其缩放副本生成后立即释放（`plan --json` 在 `notes`
中说明）。1B 全参微调时更新阶段因此多 4.60 GiB，仍低于反向的峰值。O3 的半精度梯度逐个在 fp32 中相乘再转回
（因子不会在 fp16 中下溢）：多一份新的半精度梯度，外加最大梯度的 fp32 转换和乘积（1B 的词嵌入为 1.96 GiB）。

数据并行时，HCCL 每个通信域在 MindSpore 的内存池之外占 2 × 200 MB（2 × HCCL_BUFFSIZE）：`plan` 检查它们能放进
内存池之外剩下的 HBM（910A 上为 32 GiB - 29 GiB），不计入任何阶段。更新阶段还有 all-reduce 的输出，每次一个融合桶
（MindSpore 默认 64 MB 阈值，或最大的梯度，即词嵌入的梯度），k > 1 时再拷回累积缓冲区。切分布局（模型 / 流水线并行、
优化器切分）使用 MindFormers 的封装，其累积版本非就地地缩放累积缓冲区（`MFPipelineWithLossScaleCell`，
mindformers/wrapper/wrapper.py）：更新阶段多一整份 fp32 梯度；反向结束时还有自动微分生成的稠密查表梯度及两部分之和
（多两个与词嵌入同形的 fp32 张量）。`tests/test_strategies.py` 在编译后的训练步计算图中
统计与词嵌入同形的 fp32 张量：head 的梯度和优化器的，没有别的。

随附的 910A 配方，逐阶段（GiB，不含余量）：

| 配方 | 前向 | 反向 | 更新 | 峰值 | 余量之外的剩余 |
|---|---|---|---|---|---|
{phases}

## 常见数字错在哪里

1. "1B"、"3B" 是约数：两个模型分别有 {p1} 和 {p3} 个参数，所有"每参数字节数"都要乘以真实参数量。
2. 3B 模型的 hidden size 是 3072（28 层、24 个注意力头、8 个 KV 头），不是 2560。
3. 混合精度并不会让模型状态减半：fp32 主权重（4 字节）、矩阵乘法用的 FP16 副本（2）、fp32 梯度（4）
   和 AdamW 的两个 fp32 动量（8）都还在。3B 模型在任何激活之前就需要 {states3} GiB，仅 AdamW 动量就有 {adam3} GiB。
4. 梯度累积只减少激活，从不减少模型状态："3B 用 FP16 加梯度累积全参数微调不到 10 GB" 在单卡上不可能。
   能放下它的是切分（数据并行上的优化器切分、模型并行）或 LoRA。
5. 不计层数或不计 logits 的激活估算会差一个数量级：词表有 128,256 个 token，一条 512 token 序列的 logits
   和 loss 就占 {logits} GiB，而 28 层的全部激活是 {act} GiB。

## 运行时的 INT8

`benchmarks/int8_memory.py` 测量以 int8 保存权重能省下多少（带 `--weights` 的 `eval`/`generate`，LoRA 的
`strategies.lora.base_dtype: int8`；见[评估与导出](evaluation-and-export.zh-CN.md)）。它用随机权重构建真实的 1B 形状
（hidden 2048，16 层，完整词表），通过 eval 自己的单元做一次 1 x 512 token 的评估前向，权重分别以 float32、float16 和 int8
保存，各在一个子进程中，运行于 PYNATIVE_MODE（CPU 后端在那里会释放算子的临时缓冲区；GRAPH_MODE 的图会保留它分配的每个
缓冲区）。每个子进程记录自己的基线（导入和加载 tokenizer 之后、构建模型之前的 VmHWM）和峰值。这是 MindSpore CPU 后端上的
主机内存，不是 NPU 显存。本机（2 核，共享，2026-12-02）上的输出：

```
{int8_output}
```

保存的权重与规划器的权重数字完全一致（int8：每个线性层权重 1 字节加 fp32 缩放因子，词嵌入和归一化层为 fp16）。int8/fp16
的评估峰值（减去基线）为 1.82 / 2.71 = 0.673，规划器对同一形状在 910A 上（它的 int8 层运行同样的先转换再缩放的内核）给出
0.663；整个进程的比值 0.747 含有 0.79 GiB 的导入基线。fp16 和 int8 子进程中超出所保存权重的临时内存约 0.4 GiB：eval 的 int8
层每次反量化 2^21 个权重（fp32 下 8 MB，而 1B 的 MLP 权重是 67 MB），分块的 LM head 对以 fp16 保存的 head 每次只转换 8,192
行词表，并跨块累积 log-sum-exp，因此两者都不会持有整个矩阵的 fp32 副本（在此之前，head 为每个分块把 fp16 词嵌入整个转成
fp32，1.05 GiB，使比值停在 0.885）。fp32 子进程照旧一次算出它的 logits（无需转换）。

在这个后端上 LoRA 训练的情况相反：训练步运行于 GRAPH_MODE（它的 PyNative 训练步在 MindSpore 2.9.0 的 CPU 后端上会停下，
fp16 基座也一样），而 CPU 上 GRAPH_MODE 的图会保留它分配的每个缓冲区，所以 int8 基座在前向和反向中形成的每个反量化权重都一直
占着内存：减去基线后的峰值是 fp16 基座的 2.0 倍。规划器按图内存规划器会把一层的临时内存复用给下一层的情形（昇腾就是这样）
计算 int8 基座（此处未测量：没有卡）；在 CPU 上，int8 基座用来检查配方，而不是用来节省主机内存。
"""


def offload_facts() -> dict:
    from llama_npu.strategies import offload

    shape = PRESETS["llama3.2-3b"]
    c = estimate(shape, cached_parameter_count(shape), DEVICES["910b"],
                 Strategy(seq_len=512, micro_batch=1, global_batch=1, dtype="bfloat16")).components
    return {"host_bandwidth": offload.DEFAULT_HOST_BANDWIDTH, "update_bytes": offload.UPDATE_BYTES_PER_PARAMETER,
            "states_3b": g(c["weights"] + c["weight_compute_copies"] + c["gradients"] + c["optimizer_states"])}


def offload_rows():
    """The longest sequence each model fully fine-tunes on one card, with the optimizer on the card
    and on the host (the planner's --fit --maximize seq-len search), and the host's side."""
    from llama_npu.memory.fit_choice import longest_fitting
    from llama_npu.strategies import offload

    rows = []
    for name in MODELS:
        shape, params = PRESETS[name], cached_parameter_count(PRESETS[name])
        for device in (DEVICES["910a"], DEVICES["910b"]):
            base = Strategy(seq_len=512, micro_batch=1, global_batch=1, amp_level="O2",
                            dtype="bfloat16" if device.bf16 else "float16")
            found = [longest_fitting(shape, params, device, replace(base, offload=on_host), 1, False,
                                     allow_offload=False)[0] for on_host in (False, True)]
            card, host = found
            longest = [f"{plan.strategy.seq_len:,}" if plan else "none" for plan in found]
            host_gb = g(sum(host_states(shape, params, base).values()))
            seconds = offload.update_seconds(params, base, offload.DEFAULT_HOST_BANDWIDTH)
            rows.append(f"| {name} | {device.name} | {longest[0]} | {longest[1]} | "
                        f"{g(host.total_bytes) if host else '-'} | {host_gb} | {seconds:.2f} s |")
    return rows


def phase_rows():
    from llama_npu.memory.devices import get_device
    from llama_npu.memory.planner import strategy_from_recipe
    from llama_npu.model.architecture import resolve_shape
    from llama_npu.recipe.load import load_recipe

    rows = []
    for path in sorted((REPO / "recipes").glob("*910a*.yaml")):
        recipe = load_recipe(path)
        device = get_device(recipe.device.name, recipe.device.max_device_memory)
        shape = resolve_shape(recipe.model)
        plan = estimate(shape, cached_parameter_count(shape), device, strategy_from_recipe(recipe, recipe.device.name))
        p = plan.phases
        rows.append(f"| `{path.name}` | {g(p['forward'])} | {g(p['backward'])} | {g(p['update'])} | "
                    f"{plan.peak_phase} | {g(device.usable_bytes - plan.total_bytes)} |")
    return rows


def render() -> dict:
    values = dict(inference="\n".join(inference_rows()), training="\n".join(training_rows()),
                  usual_int8="\n".join(usual_int8_rows()), lora="\n".join(training_rows(LORA)),
                  phases="\n".join(phase_rows()), int8_output=INT8_OUTPUT, offload="\n".join(offload_rows()),
                  **offload_facts(), **facts())
    return {REPO / "docs" / "memory.md": EN.format(**values), REPO / "docs" / "memory.zh-CN.md": ZH.format(**values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    stale = []
    for path, text in render().items():
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(path)
        else:
            path.parent.mkdir(exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(REPO)}")
    for path in stale:
        print(f"{path.relative_to(REPO)} is out of date: run scripts/memory_tables.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
