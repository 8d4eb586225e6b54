"""INT8 at run time (issue 30): a quantized model that stays int8 in eval/generate, and LoRA over
an int8 frozen base. The refusals first (validate only), then tiny real runs on the CPU."""
import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from llama_npu.recipe.load import load_recipe
from llama_npu.recipe.problems import RecipeError

from conftest import REPO, SMOKE, TINY_RUN, assert_same_steps, read_metrics, run_cli


@pytest.fixture(scope="session")
def quantized(conversions, tmp_path_factory):
    """The tiny float32 conversion, quantized by `llama-npu quantize`'s own function."""
    from llama_npu.weights.quantize import quantize_checkpoint

    dst = tmp_path_factory.mktemp("int8") / "tiny-int8"
    quantize_checkpoint(conversions["float32"], dst)
    return dst


@pytest.mark.parametrize("overrides, message", [
    (["strategies.lora.base_dtype=int8"], "strategies.lora.base_dtype=int8 needs strategies.lora.enabled=true: a "
                                          "full fine-tune trains the base weights"),
    (["strategies.lora.base_dtype=fp8"], "strategies.lora.base_dtype: expected one of compute, int8, got 'fp8'"),
    (["strategies.lora.enabled=true", "strategies.lora.base_dtype=int8", "strategies.parallel.model=2"],
     "strategies.lora.base_dtype=int8 with strategies.parallel.model=2: the int8 base is not sharded"),
])
def test_int8_base_refusals(overrides, message):
    with pytest.raises(RecipeError) as caught:
        load_recipe(SMOKE, overrides)
    assert message in str(caught.value)


def test_quantized_directory_cannot_start_a_full_fine_tune(quantized, tmp_path):
    proc = run_cli("validate", SMOKE, "--set", f"model.checkpoint={quantized}", "--set", "model.preset=tiny",
                   "--output-dir", tmp_path / "run")
    assert proc.returncode == 2
    assert f"model.checkpoint={quantized} is quantized (int8, by llama-npu quantize): a full fine-tune" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    # A quantized directory with a scale missing: LoRA over it is refused, naming the tensor.
    import mindspore as ms

    damaged = tmp_path / "damaged"
    shutil.copytree(quantized, damaged)
    kept = [{"name": k, "data": v} for k, v in ms.load_checkpoint(str(quantized / "model.ckpt")).items()
            if k != "model.layers.1.feed_forward.w3.weight.int8_scale"]
    ms.save_checkpoint(kept, str(damaged / "model.ckpt"))
    from llama_npu.common.checksums import write_manifest

    write_manifest(damaged, "a scale left out, sealed as sound")  # the scale check is tested, not the checksum's
    lora = run_cli("validate", SMOKE, "--set", f"model.checkpoint={damaged}", "--set", "model.preset=tiny",
                   "--set", "strategies.lora.enabled=true", "--set", "strategies.lora.base_dtype=int8",
                   "--output-dir", tmp_path / "run")
    assert lora.returncode == 2 and len(lora.stderr.strip().splitlines()) == 1, lora.stderr
    assert "tensor model.layers.1.feed_forward.w3.weight.int8_scale is missing" in lora.stderr


@pytest.fixture(scope="session")
def dequantized(quantized, tmp_path_factory):
    """A float32 directory whose weights are exactly q x s of `quantized`: the model today's
    dequantize-at-load path evaluates, and the float base LoRA over the int8 base must equal."""
    import mindspore as ms

    from llama_npu.weights.tensor_files import dequantize

    meta = json.loads((quantized / "config.json").read_text(encoding="utf-8"))
    meta.pop("quantization")
    dst = tmp_path_factory.mktemp("dequantized") / "tiny-qxs"
    dst.mkdir()
    (dst / "config.json").write_text(json.dumps(meta), encoding="utf-8")
    arrays = dequantize({k: v.asnumpy() for k, v in ms.load_checkpoint(str(quantized / "model.ckpt")).items()})
    ms.save_checkpoint([{"name": k, "data": ms.Tensor(v)} for k, v in arrays.items()], str(dst / "model.ckpt"))
    return dst


def test_quantized_directory_stays_int8_and_its_logits_equal_dequantize_at_load(ms, quantized, dequantized,
                                                                                  monkeypatch):
    """eval/generate's model of a quantized directory (--weights stored) against today's
    dequantize-at-load model (the float q x s directory): the logits and the held-out loss."""
    from llama_npu.data.readers import read_records
    from llama_npu.data.samples import tokenize_records
    from llama_npu.data.tokenizer import load_tokenizer
    from llama_npu.evaluation.loaded_model import build_from_checkpoint
    from llama_npu.evaluation.loss_loop import evaluate
    from test_convert import logits_of

    tokens = np.random.default_rng(0).integers(0, 128000, (2, 24)).astype(np.int32)
    int8_net, int8_loss, _ = build_from_checkpoint(quantized, 24, batch_size=2, device="cpu")
    dtypes = {p.name: p.dtype for p in int8_net.get_parameters()}
    assert dtypes["model.layers.0.attention.wq.weight"] == ms.int8
    assert dtypes["model.layers.1.feed_forward.w2.int8_scale"] == ms.float32
    linear = [n for n, d in dtypes.items() if re.search(r"\.w[qkvo123]\.weight$", n)]
    assert len(linear) == 14 and all(dtypes[n] == ms.int8 for n in linear)
    float_net, float_loss, _ = build_from_checkpoint(dequantized, 24, batch_size=2, device="cpu")
    assert np.array_equal(logits_of(ms, int8_net, tokens), logits_of(ms, float_net, tokens))  # same math: bit-exact
    held_out = read_records([REPO / "data" / "zh_instruct_eval.jsonl"], "alpaca")[:8]
    samples, _ = tokenize_records(load_tokenizer("llama3.2"), held_out, 25)
    losses = [evaluate(loss_cell, samples, 2, 25)[0] for loss_cell in (int8_loss, float_loss)]
    assert abs(losses[0] - losses[1]) < 1e-4
    # The 1B's weights are dequantized a block of output channels at a time (the tiny model's fit
    # in one block): with blocks of 2,048 weights (2 to 4 blocks a weight) the logits are still bit-identical.
    import llama_npu.model.int8_linear as int8_linear

    monkeypatch.setattr(int8_linear, "DEQUANT_BLOCK", 2048)
    blocked_net, _, _ = build_from_checkpoint(quantized, 24, batch_size=2, device="cpu")
    assert np.array_equal(logits_of(ms, blocked_net, tokens), logits_of(ms, float_net, tokens))
    # --weights fp16: the weights held in fp16, computing in fp32, within fp16's rounding of the weights
    half_net, half_loss, _ = build_from_checkpoint(dequantized, 24, batch_size=2, device="cpu", weights="fp16")
    # (the norms stay fp32: MindFormers' layernorm_compute_type)
    held = {p.name: p.dtype for p in half_net.get_parameters()}
    assert {n for n, d in held.items() if d != ms.float16} == {n for n in held if n.endswith("norm.weight") or
                                                               n.endswith("norm_out.weight")}
    assert held["model.tok_embeddings.embedding_weight"] == ms.float16
    assert abs(evaluate(half_loss, samples, 2, 25)[0] - losses[1]) < 1e-2


# ---------------------------------------------------------------- LoRA over an int8 frozen base

LORA = [*TINY_RUN, "--set", "strategies.lora.enabled=true", "--set", "strategies.lora.target_modules=.*wq|.*wv|.*w2",
        "--set", "train.optimizer.lr=0.05"]
FIVE = [*LORA, "--set", "train.max_steps=5", "--set", "train.save_every=5"]
# AMP O2 fp16 with dynamic loss scaling (the 910A's), 2 micro-batches a step, full recompute,
# chunked cross-entropy: one run over the int8 base, checkpointed at step 2 for the resume.
COMPOSED = [*LORA, "--set", "strategies.precision.amp_level=O2", "--set", "strategies.precision.loss_scale=dynamic",
            "--set", "train.global_batch_size=4", "--set", "strategies.recompute.mode=full",
            "--set", "strategies.chunked_ce.enabled=true", "--set", "strategies.chunked_ce.chunk_size=16",
            "--set", "train.max_steps=4", "--set", "train.save_every=2", "--set", "train.keep_last=3",
            "--set", "strategies.lora.base_dtype=int8"]


@pytest.fixture(scope="module")
def lora_runs(quantized, dequantized, conversions, tmp_path_factory):
    """name -> run directory: LoRA over the int8 base (a quantized directory) and over its
    exact float q x s, 5 steps in fp32; the composed run over a float checkpoint quantized at load."""
    out = tmp_path_factory.mktemp("int8-lora")
    runs = {"int8": [*FIVE, "--set", f"model.checkpoint={quantized}", "--set", "strategies.lora.base_dtype=int8"],
            "qxs": [*FIVE, "--set", f"model.checkpoint={dequantized}"],
            "composed": [*COMPOSED, "--set", f"model.checkpoint={conversions['float32']}"]}
    with ThreadPoolExecutor(len(runs)) as pool:  # three small runs side by side
        for name, proc in zip(runs, pool.map(lambda a: run_cli("train", SMOKE, "--output-dir", out / a[0], *a[1]),
                                               runs.items())):
            assert proc.returncode == 0, (name, proc.stderr[-3000:])
    return {name: out / name for name in runs} | {"args": runs}


def adapters(step_dir):
    import mindspore as ms

    return {k: v.asnumpy() for k, v in ms.load_checkpoint(str(step_dir / "model.ckpt")).items()}


def test_lora_over_int8_base_equals_lora_over_its_float_q_x_s(lora_runs):
    int8, qxs = read_metrics(lora_runs["int8"]), read_metrics(lora_runs["qxs"])
    assert [r["step"] for r in int8] == [1, 2, 3, 4, 5]
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(int8, qxs)) < 1e-5
    ours, theirs = (adapters(lora_runs[name] / "checkpoints" / "step_5") for name in ("int8", "qxs"))
    assert sorted(ours) == sorted(theirs) and all("mindpet_delta_lora" in name for name in ours)  # adapters only
    assert max(float(np.abs(ours[k] - theirs[k]).max()) for k in ours) < 1e-6
    assert any(np.abs(ours[k]).max() > 0 for k in ours if k.endswith("lora_b"))  # they trained


def test_int8_base_composes_resumes_exactly_and_exports_with_its_cost(lora_runs, conversions, tmp_path):
    straight = lora_runs["composed"]
    rows = read_metrics(straight)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all(np.isfinite(r["loss"]) for r in rows)
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_4")
    proc = run_cli("train", SMOKE, "--output-dir", resumed, "--resume", "auto", *lora_runs["args"]["composed"],
                   check=True)
    assert "step 2" in proc.stdout
    assert_same_steps(resumed, straight, (3, 4))
    export = run_cli("convert", "ms-to-hf", "--src", straight, "--dst", tmp_path / "hf", check=True)
    cost = float(re.search(r"max \|W - q x s\| over the decoder linear weights: (\S+)", export.stdout).group(1))
    import mindspore as ms

    from llama_npu.weights.tensor_files import LINEAR

    base = ms.load_checkpoint(str(conversions["float32"] / "model.ckpt"))
    largest = max(float(np.abs(base[k].asnumpy()).max()) for k in base if LINEAR.match(k))
    assert 0 < cost <= largest / 254 * 1.001  # at most half a step (s / 2) of the largest row's scale


def test_lora_over_int8_base_data_parallel_over_two_launched_workers_equals_one_process(lora_runs, tmp_path):
    """The composed run (int8 base quantized at load, O2 fp16 with dynamic loss scaling,
    recompute, chunked CE; global batch 4 = 2 micro-batches of 2) launched with exactly its
    arguments over 2 CPU workers by scripts/launch.sh: data auto -> 2, one micro-batch of 2 a
    rank, the same 4 samples a step. Each rank quantizes the same float base; only the adapters
    are trained and all-reduced, so the run is the one process's, checkpoints included."""
    import yaml

    from conftest import run_launch

    out, single = tmp_path / "run", lora_runs["composed"]
    proc = run_launch(SMOKE, 2, "--output-dir", out, *lora_runs["args"]["composed"], log_dir=tmp_path / "logs",
                      env={"CLUSTER_TIME_OUT": "60"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 worker(s), data parallel: data 2 x model 1 x pipeline 1" in proc.stdout
    digests = re.findall(r"rank \d weights sha256 (\w+)", proc.stdout)
    assert len(digests) == 2 and len(set(digests)) == 1  # the adapters, bit-identical on both ranks
    launched, alone = read_metrics(out), read_metrics(single)
    assert [r["step"] for r in launched] == [1, 2, 3, 4]
    for a, b in zip(launched, alone):
        assert abs(a["loss"] - b["loss"]) < 1e-5 and a["samples_consumed"] == b["samples_consumed"] == 4 * a["step"]
    assert launched[3]["loss"] != launched[0]["loss"]  # it trained: the comparison means something
    # Data parallel saves whole weights once, from rank 0 (no rank_<R> shards): the adapters only,
    # those of the one process (the same seed of the backward: bit-identical here), and the same
    # reference to the base and its quantization (the stored recipe's model and lora sections).
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_2", "step_4"]
    for step in ("step_2", "step_4"):
        ours, theirs = (adapters(run / "checkpoints" / step) for run in (out, single))
        assert sorted(ours) == sorted(theirs) and all("mindpet_delta_lora" in name for name in ours)
        assert max(float(np.abs(ours[k] - theirs[k]).max()) for k in ours) < 1e-6
    assert any(np.abs(ours[k]).max() > 0 for k in ours if k.endswith("lora_b"))  # they trained
    ours, theirs = (yaml.safe_load((run / "recipe.yaml").read_text(encoding="utf-8")) for run in (out, single))
    assert ours["model"] == theirs["model"] and ours["model"]["checkpoint"].endswith("float32")
    assert ours["strategies"]["lora"] == theirs["strategies"]["lora"]
    assert ours["strategies"]["lora"]["base_dtype"] == "int8"


# ---------------------------------------------------------------- the 910B kernel's arguments (issue 39)

def wqbmm_emulated(x, weight, scale, transpose_weight):
    """CANN's WeightQuantBatchMatmul as aclnnWeightQuantBatchMatmulV2's documentation writes it
    (no CPU kernel: "WeightQuantBatchMatmul unregistered"): y = x @ ANTIQUANT(weight) with the
    weight (k, n), or its transpose when transpose_weight, ANTIQUANT(w) = w x scale along n in
    x's dtype, the products summed in fp32 and the output in x's dtype. The scale's layout
    is checked first, by the rule CANN checks on A2/A3 (model/wqbmm_arguments.py
    per_channel_scale_ok: aclnn_weight_quant_batch_matmul_v2.cpp CheckAntiquantParamShape)."""
    from llama_npu.model.wqbmm_arguments import per_channel_scale_ok

    assert per_channel_scale_ok(weight.shape, scale.shape, transpose_weight), (weight.shape, scale.shape)
    w = weight.T if transpose_weight else weight
    antiquant = (w.astype(np.float32) * scale.astype(np.float32).reshape(1, -1)).astype(x.dtype)
    return (x.astype(np.float32) @ antiquant.astype(np.float32)).astype(x.dtype)


def wqbmm_calls(cell, x, dout):
    """call -> (numpy arguments, transpose_weight) the 910B cell would pass the kernel, from its
    own seams (Int8MatMul.forward_arguments / backward_arguments), run on the CPU."""
    import mindspore as ms

    m = cell.int8_matmul
    calls = {"forward": (m.forward_arguments(ms.Tensor(x), cell.weight, cell.int8_scale), m.wqbmm),
             "backward": (m.backward_arguments(ms.Tensor(dout), cell.weight, cell.int8_scale), m.wqbmm_dx)}
    return {name: ([a.asnumpy() for a in args], prim.transpose_weight) for name, (args, prim) in calls.items()}


def int8_layer(rng, rows=32, in_channels=96, out_channels=64, magnitude=1.0):
    from llama_npu.weights.tensor_files import dequantize_rows, quantize_rows

    q, scale = quantize_rows((rng.standard_normal((out_channels, in_channels)) * 0.02).astype(np.float32))
    x = rng.standard_normal((rows, in_channels)).astype(np.float16)
    dout = (rng.standard_normal((rows, out_channels)) * magnitude).astype(np.float16)
    return q, scale, x, dout, dequantize_rows(q, scale).astype(np.float64)


def dequant_path(ms, q, scale, x, dout):
    """(y, dx) of the int8 cell the 910A and the CPU run (the dequantize kernel), fp16, by MindSpore."""
    from llama_npu.model.int8_linear import Int8Linear

    cell = Int8Linear(q, scale, ms.float16, "dequant")
    y = cell(ms.Tensor(x)).asnumpy()
    g = ms.Tensor(dout)

    def weighted(inputs):
        return (cell(inputs) * g).sum()

    return y, ms.grad(weighted)(ms.Tensor(x)).asnumpy()


def relative(a, b):
    return float(np.abs(a.astype(np.float64) - b).max() / np.abs(b).max())


def test_910b_cell_passes_the_kernel_a_scale_cann_accepts_and_its_formula_is_the_layers(ms):
    """The 910B cell in a dry run: the arguments it hands WeightQuantBatchMatmul, forward and
    bprop (x, weight, antiquant_scale, transpose_weight) are those model/wqbmm_arguments.py
    names (selftest --dry-run lists them) and pass CANN's per-channel rule; the kernel's formula
    over them is the layer's x W^T and dout W, as the dequantize path computes them."""
    from llama_npu.model.int8_linear import Int8Linear
    from llama_npu.model.wqbmm_arguments import per_channel_scale_ok, wqbmm_argument_shapes

    q, scale, x, dout, w = int8_layer(np.random.default_rng(0))
    calls = wqbmm_calls(Int8Linear(q, scale, ms.float16, "wqbmm"), x, dout)
    expected = wqbmm_argument_shapes(32, 96, 64)
    for name, (args, transpose) in calls.items():
        shapes = dict(zip(("x", "weight", "antiquant_scale"), (a.shape for a in args)), transpose_weight=transpose)
        assert shapes == expected[name], name
        assert [a.dtype for a in args] == [np.float16, np.int8, np.float16], name
        assert per_channel_scale_ok(args[1].shape, args[2].shape, transpose), name
    assert expected["forward"]["antiquant_scale"] == (64,)  # n = the output channels: CANN's (n,)
    assert not per_channel_scale_ok((64, 96), (64, 1), True)  # the (out, 1) layout the cell used to pass
    y, dx = (wqbmm_emulated(*args, transpose) for args, transpose in calls.values())
    y_ref, dx_ref = x.astype(np.float64) @ w.T, dout.astype(np.float64) @ w
    y_dequant, dx_dequant = dequant_path(ms, q, scale, x, dout)
    assert relative(y, y_ref) < 1e-2 and relative(dx, dx_ref) < 1e-2  # selftest int8_matmul's tolerance
    assert relative(y, y_dequant.astype(np.float64)) < 1e-2 and relative(dx, dx_dequant.astype(np.float64)) < 1e-2


def test_910b_bprop_keeps_fp16_gradients_of_1e_6_as_the_dequantize_path_does(ms):
    """fp16 gradients of magnitude 1e-6 through the 910B bprop's formula: within the dequantize
    path's error against the exact dout W. The former formula, (dout x s) cast to fp16 before
    the kernel, flushed them: s is about 1e-4, so dout x s lies below fp16's smallest subnormal."""
    from llama_npu.model.int8_linear import Int8Linear

    q, scale, x, dout, w = int8_layer(np.random.default_rng(1), magnitude=1e-6)
    exact = dout.astype(np.float64) @ w
    _, dx_dequant = dequant_path(ms, q, scale, x, dout)
    args, transpose = wqbmm_calls(Int8Linear(q, scale, ms.float16, "wqbmm"), x, dout)["backward"]
    dx = wqbmm_emulated(*args, transpose)
    tolerance = relative(dx_dequant, exact)
    assert 0 < tolerance < 0.1  # dx near 1e-6 x 0.02 x 8: fp16 subnormals (5.2% here)
    assert relative(dx, exact) <= 2 * tolerance, (relative(dx, exact), tolerance)  # 7.3% here
    former = wqbmm_emulated((dout * scale.astype(np.float16)).astype(np.float16), q, np.ones(96, np.float16), False)
    assert relative(former, exact) > 0.5  # what the test would have caught


def test_910b_bprop_of_a_weight_with_an_all_zero_row_stays_finite(ms):
    """A row of zeros quantizes to scale 1.0 (quantize_rows), far above the others' ~1e-4: its
    ratio to the largest scale was 1/c (~1,600 here), so an fp16 dout of 100 became inf and the kernel's
    inf x 0 a NaN that skips every step. Its q is 0, so clamping the ratio changes no product."""
    from llama_npu.model.int8_linear import Int8Linear
    from llama_npu.weights.tensor_files import quantize_rows

    rng = np.random.default_rng(2)
    weight = (rng.standard_normal((64, 96)) * 0.02).astype(np.float32)
    weight[5] = 0.0
    q, scale = quantize_rows(weight)
    assert scale[5] == 1.0
    dout = np.full((32, 64), 100.0, np.float16)
    args, transpose = wqbmm_calls(Int8Linear(q, scale, ms.float16, "wqbmm"), rng.standard_normal((32, 96)).astype(
        np.float16), dout)["backward"]
    assert np.isfinite(args[0]).all()
    dx = wqbmm_emulated(*args, transpose)
    assert np.isfinite(dx).all()
    exact = dout.astype(np.float64) @ (q.astype(np.float64) * scale[:, None])
    assert relative(dx, exact) < 1e-2


# ---------------------------------------------------------------- what the 910A's graph keeps alive (issue 39)

# The smallest decoder whose MLP weights block (in x out > DEQUANT_BLOCK = 2^21 weights):
# 256 x 8200, two blocks each for w1, w3 (8192 + 8 rows) and w2 (255 + 1 rows); one layer.
BLOCKING = ["model.hidden_size=256", "model.intermediate_size=8200", "model.num_layers=1"]


def ir_graph(ir_file):
    """({node: (op, [inputs])} of the dump's first graph, the int8 Parameters' names)."""
    import re

    text = ir_file.read_text()
    params = set(re.findall(r"^(%para\d+_\S+): <Ref\[Tensor\[Int8\]\]", text, re.M))
    nodes = {}
    for line in text.split("\nsubgraph @")[1].splitlines():
        found = re.match(r"\s*(%\d+)\(\S*\) = (?:PrimFunc_)?(\w+)\((.*)", line)
        if found:
            nodes[found.group(1)] = found.group(2), re.findall(r"%[\w.]+", found.group(3))
    return nodes, params


def int8_reads(nodes, params):
    """[(weight name, op, the node its read is ordered after or None, node)] of every StridedSlice
    (a block) or Cast (a whole weight) of an int8 Parameter, through the Load / Depend /
    TensorMove nodes MindSpore puts between a Parameter and its reader."""
    reads = []
    for node, (op, inputs) in nodes.items():
        if op not in ("StridedSlice", "Cast") or not inputs:
            continue
        source, after = inputs[0], None
        while source not in params and nodes.get(source, ("",))[0] in ("Load", "Depend", "TensorMove"):
            kind, source_inputs = nodes[source]
            after = after or (source_inputs[1] if kind == "Depend" else None)
            source = source_inputs[0]
        if source in params:
            reads.append((source.split("layers.0.")[1].removesuffix(".weight"), op, after, node))
    return reads


def ancestors_of(nodes, node) -> set:
    seen, todo = set(), [node]
    while todo:
        for parent in nodes.get(todo.pop(), ("", []))[1]:
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_int8_blocks_are_dequantized_one_after_another_and_shared_by_no_two_forwards(ms, tmp_path, recompute):
    """DPO with the adapters_off reference over an int8 base whose MLP weights block, compiled
    (one step), the IR counted: every block written is in the graph (the reference forward's,
    the policy's, and under full recompute the policy's recomputed w1 and w3: w2's output is
    not needed again), none merged by CSE (before: 6 where 12 are written); each block's read
    ordered after the previous block's matmul, the first after the layer's input; every whole
    weight's read (the unblocked forwards, the bprops) ordered after its input or dout."""
    import collections

    from test_preference import dpo_step, pair_batch

    ids, labels = pair_batch()
    sets = ["strategies.lora.enabled=true", "strategies.lora.base_dtype=int8", "model.random_init=true",
            "dpo.reference=adapters_off", f"strategies.recompute.mode={recompute}", *BLOCKING]
    _, _, step = dpo_step(ms, sets, 1)
    ms.set_context(save_graphs=1, save_graphs_path=str(tmp_path))
    try:
        step([(ids, labels, np.full(4, -1e3, np.float32))], 0.5)
    finally:
        ms.set_context(save_graphs=0)
    (ir,) = tmp_path.glob("*_validate_*.ir")  # the graph the backend receives, after CSE
    nodes, params = ir_graph(ir)
    reads = int8_reads(nodes, params)
    blocks = collections.Counter(name for name, op, _, _ in reads if op == "StridedSlice")
    forwards = {"feed_forward.w1": 2, "feed_forward.w3": 2, "feed_forward.w2": 2}
    if recompute == "full":
        forwards["feed_forward.w1"] = forwards["feed_forward.w3"] = 3
    assert blocks == {name: 2 * n for name, n in forwards.items()}  # two blocks a forward
    assert all(after is not None for *_, after, _ in reads)  # an ordering edge on every read
    slices = {node for name, op, _, node in reads if op == "StridedSlice"}
    for name, op, after, node in reads:
        if op == "StridedSlice" and nodes[after][0] == "MatMul":  # a second block: after the first's matmul
            assert any(s in ancestors_of(nodes, after) for s in slices if s != node)
    firsts = [after for name, op, after, _ in reads if op == "StridedSlice" and nodes[after][0] != "MatMul"]
    assert len(firsts) == sum(forwards.values())  # one first block a forward, after the layer's input
    # The whole weights: the unblocked ones' forwards (2, or 3 recomputed) and one bprop each
    # (wq, wk and wv of the only layer need no input gradient); the blocked ones' bprops.
    wholes = collections.Counter(name for name, op, _, _ in reads if op == "Cast")
    again = 1 if recompute == "full" else 0
    assert wholes == {"attention.wq": 2 + again, "attention.wk": 2 + again, "attention.wv": 2 + again,
                      "attention.wo": 3 + again, "feed_forward.w1": 1, "feed_forward.w2": 1, "feed_forward.w3": 1}
