"""Each memory strategy on a real tiny model (CPU, GRAPH_MODE, fp32 unless stated)."""
import numpy as np
import pytest

from llama_npu.recipe.load import load_recipe
from llama_npu.recipe.problems import RecipeError

from conftest import SMOKE

SEQ = 32


def recipe(*overrides):
    return load_recipe(SMOKE, [f"data.max_seq_len={SEQ}", "data.eval_files=[]", "train.grad_clip=0",
                               "train.global_batch_size=0", *overrides])


def build(ms, *overrides):
    from llama_npu.strategies.network import build_network

    ms.set_seed(0)
    return build_network(recipe(*overrides), on_ascend=False)


def batch(rows, targets_from, seed):
    """(rows, SEQ+1) random ids; labels only from position `targets_from` on."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 128000, (rows, SEQ + 1)).astype(np.int32)
    labels = ids.copy()
    labels[:, :targets_from] = -100
    return ids, labels


def loss_and_grads(ms, loss_cell, net, ids, labels):
    fn = ms.value_and_grad(loss_cell, None, net.trainable_params())
    loss, grads = fn(ms.Tensor(ids), ms.Tensor(labels))
    return float(loss.asnumpy()), [g.asnumpy() for g in grads]


def assert_grads_close(got, want, rtol):
    for g, w in zip(got, want):
        scale = np.abs(w).max() + 1e-30
        assert np.abs(g - w).max() / scale < rtol


def train_step(ms, net, loss_cell, *overrides, k=1):
    from llama_npu.strategies.precision import LossScaler
    from llama_npu.steps.optimizer import build_optimizer
    from llama_npu.steps.graph_step import TrainStep

    r = recipe(*overrides)
    optimizer = build_optimizer(net.trainable_params(), r.train)
    return TrainStep(loss_cell, optimizer, LossScaler(r.strategies.precision), r.train.grad_clip, k)


def weights(net):
    return {p.name: p.asnumpy().copy() for p in net.get_parameters()}


def test_accumulated_micro_batches_equal_one_large_batch(ms):
    """Two micro-batches with very different target-token counts, accumulated, give the same
    SGD step as one batch holding both: the loss is normalised by the step's tokens."""
    sgd = ("train.optimizer.name=sgd", "train.optimizer.lr=0.5", "train.warmup_steps=0")
    many = batch(2, 1, seed=1)  # 64 target tokens
    few = batch(2, SEQ - 3, seed=2)  # 8 target tokens
    together = (np.concatenate([many[0], few[0]]), np.concatenate([many[1], few[1]]))

    net_a, cell_a = build(ms)
    before = weights(net_a)
    result_a = train_step(ms, net_a, cell_a, *sgd, k=2)([many, few], lr=0.5)
    net_b, cell_b = build(ms)
    result_b = train_step(ms, net_b, cell_b, *sgd)([together], lr=0.5)

    assert result_a.target_tokens == result_b.target_tokens == 72
    assert result_a.loss == pytest.approx(result_b.loss, rel=1e-5)
    after_a, after_b = weights(net_a), weights(net_b)
    moved = 0
    for name, w in after_b.items():
        np.testing.assert_allclose(after_a[name], w, rtol=1e-5, atol=1e-7)
        moved += not np.array_equal(w, before[name])
    assert moved > 10  # the step did change the weights


@pytest.mark.parametrize("k", [1, 2])
def test_a_step_moves_each_weight_by_the_autodiff_gradient(ms, k):
    """One SGD step (no clip) changes every weight by minus lr x autodiff's gradient of the
    step's mean token loss, the tied embedding included: the step takes the lookup's gradient
    as rows and adds them at the tokens' rows, here with tokens repeated within and across
    micro-batches."""
    ids, labels = batch(2 * k, 1, seed=5)
    ids[:, ::3] = 17  # the same token many times in every row
    labels[:, ::3] = 17
    net, cell = build(ms)
    before = weights(net)
    loss, grads = loss_and_grads(ms, cell, net, ids, labels)
    tokens = int((labels[:, 1:] != -100).sum())
    sgd = ("train.optimizer.name=sgd", "train.warmup_steps=0")
    lr = 1000.0  # a step far larger than the weights' float32 rounding
    train_step(ms, net, cell, *sgd, k=k)([(ids[i:i + 2], labels[i:i + 2]) for i in range(0, 2 * k, 2)], lr=lr)
    after = weights(net)
    moved = [(before[p.name] - after[p.name]) / lr for p in net.trainable_params()]
    assert_grads_close(moved, [g / tokens for g in grads], rtol=1e-4)
    embedding = [i for i, p in enumerate(net.trainable_params()) if "tok_embeddings" in p.name][0]
    assert np.abs(moved[embedding][17]).max() > 0


def test_recompute_keeps_loss_and_gradients(ms):
    ids, labels = batch(2, 5, seed=3)
    net, cell = build(ms)
    loss, grads = loss_and_grads(ms, cell, net, ids, labels)
    for mode in (["strategies.recompute.mode=full"], ["strategies.recompute.mode=selective"],
                 ["strategies.recompute.mode=full", "strategies.recompute.layers=1"]):
        net_r, cell_r = build(ms, *mode)
        loss_r, grads_r = loss_and_grads(ms, cell_r, net_r, ids, labels)
        assert loss_r == pytest.approx(loss, rel=1e-6), mode
        assert_grads_close(grads_r, grads, 1e-6)


@pytest.mark.parametrize("chunk", [16, 24])  # 64 tokens: even and uneven chunks
def test_chunked_cross_entropy_matches_full_at_128256_vocab(ms, chunk):
    ids, labels = batch(2, 7, seed=4)
    net, cell = build(ms)
    assert net.config.vocab_size == 128256
    loss, grads = loss_and_grads(ms, cell, net, ids, labels)
    net_c, cell_c = build(ms, "strategies.chunked_ce.enabled=true", f"strategies.chunked_ce.chunk_size={chunk}")
    loss_c, grads_c = loss_and_grads(ms, cell_c, net_c, ids, labels)
    assert loss_c == pytest.approx(loss, rel=1e-6)
    assert_grads_close(grads_c, grads, 1e-5)


FP16 = ("strategies.precision.amp_level=O2", "strategies.precision.dtype=float16")


def test_overflowed_fp16_step_leaves_the_weights_bit_identical(ms):
    # scale / 64 tokens is far beyond fp16's 65504: the backward pass overflows.
    net, cell = build(ms, *FP16)
    before = weights(net)
    result = train_step(ms, net, cell, *FP16, "strategies.precision.loss_scale=static:1e30")(
        [batch(2, 1, seed=5)], lr=1e-3)
    assert result.overflow and result.loss_scale == pytest.approx(1e30) and result.target_tokens == 64
    for name, w in weights(net).items():
        np.testing.assert_array_equal(w, before[name])


def test_dynamic_scale_drops_on_overflow_and_grows_back_after_its_window_on_the_device(ms):
    net, cell = build(ms, *FP16)
    step = train_step(ms, net, cell, *FP16, "strategies.precision.loss_scale=dynamic",
                      f"strategies.precision.loss_scale_init={2.0 ** 40}",
                      f"strategies.precision.loss_scale_factor={2.0 ** 30}",
                      "strategies.precision.loss_scale_window=2", k=2)
    micro = [batch(1, 1, seed=6), batch(1, 9, seed=7)]
    seen = []
    for _ in range(4):
        r = step(micro, lr=1e-3)
        seen.append((r.loss_scale, r.overflow, step.loss_scale_state()))
    assert seen == [(2.0 ** 40, True, {"scale": 2.0 ** 10, "clean_steps": 0}),
                    (2.0 ** 10, False, {"scale": 2.0 ** 10, "clean_steps": 1}),
                    (2.0 ** 10, False, {"scale": 2.0 ** 40, "clean_steps": 0}),
                    (2.0 ** 40, True, {"scale": 2.0 ** 10, "clean_steps": 0})]
    # A resumed run continues the count: one more clean step completes the window.
    step.load_loss_scale_state({"scale": 2.0 ** 10, "clean_steps": 1})
    assert not step(micro, lr=1e-3).overflow
    assert step.loss_scale_state() == {"scale": 2.0 ** 40, "clean_steps": 0}


def test_each_step_runs_with_its_own_learning_rate(ms):
    """The graph compiles at the first step; a later step's learning rate must still apply."""
    net, cell = build(ms)
    step = train_step(ms, net, cell, "train.optimizer.lr=0.05", "train.warmup_steps=0")
    step([batch(2, 1, seed=8)], lr=0.05)
    before = weights(net)
    assert not step([batch(2, 1, seed=8)], lr=0.0).overflow
    for name, w in weights(net).items():
        np.testing.assert_array_equal(w, before[name])
    step([batch(2, 1, seed=8)], lr=0.05)
    assert any(not np.array_equal(w, before[name]) for name, w in weights(net).items())


class FakeSoC:
    """What MSContext.get_instance().get_ascend_soc_version() answers on an Ascend card."""

    def __init__(self, soc):
        self.soc = soc

    def get_instance(self):
        return self

    def get_ascend_soc_version(self):
        return self.soc


def summed_loss():
    """A cell x -> the sum of a Dense(4, 1) layer's outputs."""
    from mindspore import nn

    class SummedLoss(nn.Cell):
        def __init__(self):
            super().__init__()
            self.dense = nn.Dense(4, 1)

        def construct(self, x):
            return self.dense(x).sum()

    return SummedLoss()


@pytest.mark.parametrize("soc, saturation_env, kernel", [
    ("ascend910", None, "NPUClearFloatStatusV2"),  # 910A: saturation mode only
    ("ascend910b", None, "AllFinite"),  # 910B default: INFNAN mode
    ("ascend910b", "SATURATION_MODE", "NPUClearFloatStatusV2"),
    (None, None, None),  # the CPU backend: an is-finite reduction, which runs here
])
def test_overflow_detection_follows_the_soc_the_base_class_reads(ms, monkeypatch, soc, saturation_env, kernel):
    """The base class's __init__ derives its targets from the SoC; the graph it compiles then
    holds that SoC's kernels, which the CPU backend names when it cannot select them."""
    import mindspore.nn.wrap.loss_scale as loss_scale
    from mindspore import Tensor, nn

    from llama_npu.steps.graph_step import FinalMicroStep

    net = summed_loss()
    if soc:
        monkeypatch.setattr(loss_scale, "MSContext", FakeSoC(soc))
    if saturation_env:
        monkeypatch.setenv("MS_ASCEND_CHECK_OVERFLOW_MODE", saturation_env)
    step = FinalMicroStep(net, nn.SGD(net.trainable_params(), 0.1), Tensor(1.0, ms.float32), 0.0, False, True)
    monkeypatch.undo()
    run = lambda: step(Tensor(0.1), Tensor(4.0), Tensor(0.0), Tensor(np.ones((2, 4), np.float32)))  # noqa: E731
    if kernel:
        with pytest.raises(RuntimeError, match=f"Unsupported op \\[{kernel}\\] on CPU"):
            run()
    else:
        assert run().asnumpy()[3] == 0  # no overflow


@pytest.mark.parametrize("k", [1, 3])
def test_the_step_allocates_accumulators_only_when_it_accumulates(ms, k):
    net, cell = build(ms)
    step = train_step(ms, net, cell, k=k)
    known = {id(p) for p in step.optimizer.get_parameters()} | {id(p) for p in net.get_parameters()}
    allocated = [p for p in step.final.get_parameters() if id(p) not in known]
    buffers = sum(p.nbytes for p in allocated if p.size > 1)
    assert buffers == (0 if k == 1 else 4 * sum(p.size for p in net.trainable_params()))
    assert sum(p.size for p in allocated if p.size == 1) == 3  # scale, loss and overflow flag


@pytest.mark.parametrize("name, fused", [("llama3_2_1b_zh_full_910a.yaml", False),
                                         ("llama3_2_1b_zh_full_910b.yaml", True)])
def test_ascend_recipes_resolve_flash_attention_for_their_device(ms, name, fused):
    """The 910A has neither flash attention nor the fused RmsNorm; its packed rows then take
    the additive block-causal mask the CPU path uses (tests/test_data.py checks that path's
    per-sample losses against unpacked samples)."""
    from llama_npu.model.architecture import resolve_shape
    from llama_npu.model.llama import llama_config

    r = load_recipe(SMOKE.parent / name)
    config = llama_config(resolve_shape(r.model), r.data.max_seq_len, on_ascend=True, device_name=r.device.name)
    assert (config.use_flash_attention, config.fused_rms_norm, r.data.pack) == (fused, fused, True)


def test_lora_trains_adapters_only_and_merges_exactly(ms):
    from llama_npu.strategies.lora import merge_lora

    net, cell = build(ms, "strategies.lora.enabled=true", "strategies.lora.target_modules=.*wq|.*wv|.*w2")
    trainable = {p.name for p in net.trainable_params()}
    assert trainable and all("mindpet_delta_lora" in n for n in trainable)
    assert len(trainable) == 2 * 3 * net.config.num_layers
    frozen_before = {n: w for n, w in weights(net).items() if n not in trainable}
    step = train_step(ms, net, cell, "train.optimizer.lr=0.05", "train.warmup_steps=0")
    for seed in range(3):
        assert not step([batch(2, 1, seed=seed)], lr=0.05).overflow
    after = weights(net)
    for name, w in frozen_before.items():
        np.testing.assert_array_equal(after[name], w)
    assert any(np.abs(after[n]).max() > 0 for n in trainable if "lora_b" in n)  # adapters moved

    ids, labels = batch(2, 1, seed=9)
    with_adapters, _ = loss_and_grads(ms, cell, net, ids, labels)
    assert merge_lora(net) == 3 * net.config.num_layers
    merged, _ = loss_and_grads(ms, cell, net, ids, labels)
    assert merged == pytest.approx(with_adapters, rel=1e-6)
    changed = [n for n, w in weights(net).items() if n in frozen_before and not np.array_equal(w, frozen_before[n])]
    assert sorted({n.split(".")[-2] for n in changed}) == ["w2", "wq", "wv"]


@pytest.mark.parametrize("overrides, message", [
    (["strategies.recompute.mode=some"], "strategies.recompute.mode: expected one of none, full, selective"),
    (["strategies.recompute.mode=full", "strategies.recompute.layers=5"],
     "strategies.recompute.layers: expected 0 (all) to 2"),
    (["strategies.lora.enabled=true", "strategies.lora.target_modules=.*q_proj"], "matches no layer"),
    (["strategies.precision.amp_level=O2", "strategies.precision.dtype=bfloat16"], "no BF16 kernels"),
    (["strategies.precision.amp_level=O3"], "O3 stores the weights and AdamW's moments in half precision"),
    (["strategies.precision.loss_scale=static:-1"], "expected none, dynamic or static:VALUE"),
    (["strategies.precision.loss_scale=dynamic"], "amp_level O0 computes in fp32: nothing is in fp16 to scale"),
    (["strategies.precision.amp_level=O2", "strategies.precision.dtype=bfloat16", "device.target=ascend",
      "device.name=910b", "strategies.precision.loss_scale=static:1024"], "bfloat16 has fp32's exponent range"),
    (["strategies.chunked_ce.chunksize=8"], "did you mean 'strategies.chunked_ce.chunk_size'"),
])
def test_impossible_combinations_are_refused_before_building(overrides, message):
    with pytest.raises(RecipeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        recipe(*overrides)


def fp32_producers_of_shape(ir_file, shape) -> dict:
    """{op: count} of the graph nodes in a MindSpore IR dump whose output is a new (not a
    Ref, i.e. not an in-place) fp32 tensor of `shape`."""
    import collections
    import re

    lines = ir_file.read_text().splitlines()
    wanted = re.compile(r"-> \(<Tensor\[Float32\], \(" + re.escape(", ".join(map(str, shape))) + r"\)>\)$")
    found = collections.Counter()
    for line, typed in zip(lines, lines[1:]):
        op = re.search(r"=\s*(?:PrimFunc_)?(\w+)\(", line)
        if op and wanted.search(typed.strip()):
            found[op.group(1)] += 1
    return dict(found)


def test_the_update_allocates_no_second_set_of_gradients(ms, tmp_path):
    """The compiled train step makes one embedding-sized fp32 tensor, the tied head's
    gradient, beside the optimizer's: the lookup's gradient is added as rows (no dense
    UnsortedSegmentSum, no AddN) and the unscale and clip run in place, as docs/memory.md's
    update phase counts. Before, the update's fp32 `grad * factor` was a second full set of
    gradients beside the accumulators."""
    net, cell = build(ms)
    k = 2  # SGD: a fused kernel, no temporaries of its own
    step = train_step(ms, net, cell, "train.optimizer.name=sgd", "train.grad_clip=1.0", k=k)
    ids, labels = batch(2, 1, seed=0)
    ms.set_context(save_graphs=1, save_graphs_path=str(tmp_path))
    try:
        step([(ids, labels)] * k, lr=0.01)
    finally:
        ms.set_context(save_graphs=0)
    (final,) = [f for f in tmp_path.glob("*_validate_*.ir") if "FinalMicroStep" in f.read_text()]
    made = fp32_producers_of_shape(final, net.model.tok_embeddings.embedding_weight.shape)
    made.pop("Load", None)  # reads of the weight and of its accumulator
    assert made == {"MatMul": 1, "SGD": 1}


O3_SGD = ("strategies.precision.amp_level=O3", "strategies.precision.dtype=float16", "train.optimizer.name=sgd")
CLIP = 5e-4


def one_step(ms, step, net, start, scale, tokens, ids, labels, lr=100.0):
    """The weight updates (fp32 numpy) of one FinalMicroStep call from the weights `start`."""
    from mindspore import Tensor

    for p in net.trainable_params():
        p.set_data(Tensor(start[p.name], p.dtype))
    step.scale_sense.set_data(Tensor(scale, ms.float32))
    out = step(Tensor(lr, ms.float32), Tensor(float(tokens)), Tensor(0.0), Tensor(ids), Tensor(labels)).asnumpy()
    assert out[3] == 0 and out[4] == scale  # no overflow, at the scale asked
    return {p.name: p.asnumpy().astype(np.float32) - start[p.name] for p in net.trainable_params()}, out[2]


def test_o3_fp16_unscale_and_clip_keep_the_update_at_every_loss_scale(ms):
    """O3 keeps fp16 gradients at k = 1; 1 / scale (times the clip coefficient) is 0 or a
    coarse subnormal in fp16 from a scale of 2^20 or so: the update was lost. Each O3 step
    (fp16 weights, SGD) moves the weights as the same step on the same fp16-valued weights
    in fp32 does. The step's token count is 256 (4096) times the batch's: gradients that
    small, as late in a fine-tune, are what lets a dynamic scale climb to 2^24 and beyond
    without overflowing (2^25 x gradient stays below 65504)."""
    from mindspore import nn

    from llama_npu.steps.graph_step import FinalMicroStep

    ids, labels = batch(2, 1, seed=5)  # 64 target tokens
    steps = {}
    for precision in ("fp16", "fp32"):
        net, cell = build(ms, *O3_SGD) if precision == "fp16" else build(ms)
        steps[precision] = net, FinalMicroStep(cell, nn.SGD(net.trainable_params(), 1.0), ms.Tensor(1.0),
                                               CLIP, False, True)
    start = {p.name: p.asnumpy().astype(np.float32) for p in steps["fp16"][0].trainable_params()}
    wrong = []
    for scale, share in [(2 ** 14, 256), (2 ** 20, 256), (2 ** 24, 256), (2 ** 25, 4096)]:
        got, _ = one_step(ms, steps["fp16"][1], steps["fp16"][0], start, scale, 64 * share, ids, labels)
        want, norm = one_step(ms, steps["fp32"][1], steps["fp32"][0], start, 1.0, 64 * share, ids, labels)
        assert (norm > CLIP) == (share == 256), norm  # clipping active but at 2^25
        moved = max(want, key=lambda name: np.abs(want[name]).max())
        largest = np.abs(want[moved]).max()
        assert largest > 20 * 2 ** -10 * np.abs(start[moved]).max()  # tens of fp16 steps of that weight
        # one fp16 rounding of the weight, and 2% of the largest update for fp16's forward and backward
        wrong += [(scale, name) for name, d in want.items()
                  if np.any(np.abs(got[name] - d) > 2 ** -10 * np.abs(start[name]) + 0.02 * largest)]
    assert not wrong, f"wrong at scales {sorted({scale for scale, _ in wrong})}: {wrong}"


def ir_nodes(ir_file) -> dict:
    """{node: (op, [input nodes])} of the nodes of a MindSpore IR dump's first graph (the
    others, branches, number their nodes afresh)."""
    import re

    nodes = {}
    for line in ir_file.read_text().split("\nsubgraph @")[1].splitlines():
        found = re.match(r"\s*(%\d+)\(\S*\) = (?:PrimFunc_)?(\w+)\((.*)", line)
        if found:
            nodes[found.group(1)] = found.group(2), re.findall(r"%\w+", found.group(3))
    return nodes


def ancestors(nodes, node) -> set:
    seen, todo = set(), list(nodes[node][1])
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(nodes.get(n, ("", []))[1])
    return seen


def register_step(ms, cell, net):
    """(the step `cell` names, built for the 910A's register path, its inputs before x)."""
    from mindformers.wrapper.wrapper import MFTrainOneStepCell
    from mindspore import Tensor, nn

    from llama_npu.steps.sharded_step import clearing_before_forward
    from llama_npu.steps.graph_step import AccumulatingMicroStep, FinalMicroStep

    if cell == "sharded":
        return clearing_before_forward(MFTrainOneStepCell)(net, nn.SGD(net.trainable_params(), 0.1),
                                                           scale_sense=Tensor(1.0, ms.float32)), ()
    final = FinalMicroStep(net, nn.SGD(net.trainable_params(), 0.1), Tensor(1.0, ms.float32), 0.0, True, True)
    if cell == "final":
        return final, (Tensor(0.1), Tensor(4.0), Tensor(0.0))
    return AccumulatingMicroStep(net, final.optimizer, final.carry, True), (Tensor(4.0),)


@pytest.mark.parametrize("cell", ["final", "accumulating", "sharded"])
def test_register_path_clears_before_the_forward_and_after_the_read_only(ms, monkeypatch, tmp_path, cell):
    """On the register path (the 910A's, forced here) each step graph (the micro-steps, and
    MindFormers' k = 1 wrapper of the sharded layouts) clears the float status before the
    forward reads the batch, reads it after the gradients and clears right after the read,
    with no clear in between: a saturation anywhere in the forward (a layer not recomputed,
    the loss) reaches the read. The CPU has no kernel for the register ops, so the graph is
    checked as MindSpore's front end compiled it, before kernel selection."""
    import mindspore.nn.wrap.loss_scale as loss_scale
    from mindspore import Tensor

    monkeypatch.setattr(loss_scale, "MSContext", FakeSoC("ascend910"))
    step, head = register_step(ms, cell, summed_loss())
    monkeypatch.undo()
    ms.set_context(save_graphs=1, save_graphs_path=str(tmp_path))
    try:
        with pytest.raises(RuntimeError, match=r"Unsupported op \[NPU(Clear|Get)FloatStatusV2\] on CPU"):
            step(*head, Tensor(np.ones((2, 4), np.float32)))
    finally:
        ms.set_context(save_graphs=0)
    (ir,) = tmp_path.glob("*_validate_*.ir")
    assert_clears_before_the_forward_and_after_the_read_only(ir)


def assert_clears_before_the_forward_and_after_the_read_only(ir) -> None:
    """In a step's IR dump (its input x read by a Dense layer's MatMul): one clear of the float
    status before everything, the forward included, one read after it, one clear after the read."""
    nodes = ir_nodes(ir)
    clears = [n for n, (op, _) in nodes.items() if op == "NPUClearFloatStatusV2"]
    (read,) = [n for n, (op, _) in nodes.items() if op == "NPUGetFloatStatusV2"]
    x = ("_batch0", "_inputs0")  # the step's input x, as the IR names it
    forward = [n for n, (op, inputs) in nodes.items() if op == "MatMul" and any(  # readers of x
        i.endswith(x) or nodes.get(i, ("", []))[0] == "Depend" and nodes[i][1][0].endswith(x) for i in inputs)]
    first = [c for c in clears if c in ancestors(nodes, read)]
    assert forward and all(first == [c for c in clears if c in ancestors(nodes, f)] for f in forward)
    assert len(first) == 1 and ancestors(nodes, first[0]) == set()  # before everything, the forward included
    assert [c for c in clears if read in ancestors(nodes, c)] == [c for c in clears if c not in first]
    assert len(clears) == 2


@pytest.mark.parametrize("explicit, target, graph, soc, env, level", [
    ("", "Ascend", True, "ascend910", {}, "O2"),  # the 910A's default: GE graph sink
    ("", "Ascend", True, "ascend910b", {}, "O0"),
    ("", "CPU", True, "", {}, "O0"),
    ("O1", "Ascend", True, "ascend910", {}, "O1"),  # set_context(jit_config=...) wins
    ("", "Ascend", False, "ascend910", {}, "O0"),  # PyNative
    ("O0", "Ascend", True, "ascend910b", {"RANK_TABLE_FILE": "r.json"}, "O2"),  # rank table: O2 on every SoC
    ("", "Ascend", True, "ascend910b", {"RANK_TABLE_FILE": "r.json", "MS_ROLE": "MS_WORKER"}, "O0"),  # msrun
])
def test_the_jit_level_follows_mindspores_rule(explicit, target, graph, soc, env, level):
    from llama_npu.common.jit_level import backend_of, effective_jit_level

    assert effective_jit_level(explicit, target, graph, soc, env) == level
    assert backend_of(level) == ("GE" if level == "O2" else "ms_backend")


def test_a_cells_own_jit_config_decides_its_kernels_and_the_train_step_sets_none(ms, monkeypatch):
    """Cell.set_jit_config outranks the context's (mindspore/nn/cell.py): a step cell that set
    O2 would compile for GE, which has no InplaceMul; the train step's cells set none, and a
    TrainStep whose cell did would stop at its construction, not on the card."""
    from mindspore import JitConfig, nn

    import llama_npu.steps.graph_step as step_module
    from llama_npu.common.jit_level import in_place_kernels

    sink = nn.Dense(2, 2)
    sink.set_jit_config(JitConfig(jit_level="O2"))
    assert in_place_kernels() and in_place_kernels(nn.Dense(2, 2)) and not in_place_kernels(sink)
    net, cell = build(ms)
    plain = train_step(ms, net, cell, k=2)
    assert plain.final.jit_config_dict == plain.accumulating.jit_config_dict == {}

    class OwnLevel(step_module.FinalMicroStep):
        def __init__(self, *args):
            super().__init__(*args)
            self.set_jit_config(JitConfig(jit_level="O2"))

    monkeypatch.setattr(step_module, "FinalMicroStep", OwnLevel)
    with pytest.raises(ValueError, match=r"OwnLevel has its own jit config .*O2.*, which compiles for GE"):
        train_step(ms, net, cell)


def test_the_out_of_place_step_equals_the_in_place_one(ms):
    """The step GE compiles (no InplaceMul / InplaceCopy in its graph) moves the weights as
    the in-place step does, bit for bit, over a few clipped steps."""
    runs = {}
    for in_place in (True, False):
        net, cell = build(ms)
        step = train_step(ms, net, cell, "train.optimizer.name=sgd", "train.grad_clip=1.0")
        step = type(step)(cell, step.optimizer, step.scaler, 1.0, 1, in_place=in_place)
        norms = [step([batch(2, 1, seed=s)], lr=1.0).grad_norm for s in range(3)]
        runs[in_place] = weights(net), norms
    assert runs[True][1] == runs[False][1] and min(runs[True][1]) > 1.0  # clipping active
    for name, w in runs[True][0].items():
        np.testing.assert_array_equal(runs[False][0][name], w, err_msg=name)


@pytest.mark.parametrize("in_place, kernels", [(True, {"InplaceMul"}), (False, set())])
def test_the_out_of_place_graph_has_no_in_place_kernel(ms, tmp_path, in_place, kernels):
    from mindspore import Tensor, nn

    from llama_npu.steps.graph_step import FinalMicroStep

    net = nn.Dense(4, 1)
    loss = nn.WithLossCell(net, nn.L1Loss(reduction="sum"))
    step = FinalMicroStep(loss, nn.SGD(net.trainable_params(), 0.1), Tensor(1.0, ms.float32), 1.0, True, in_place)
    ms.set_context(save_graphs=1, save_graphs_path=str(tmp_path))
    try:
        step(Tensor(0.1), Tensor(2.0), Tensor(0.0), Tensor(np.ones((2, 4), np.float32)),
             Tensor(np.ones((2, 1), np.float32)))
    finally:
        ms.set_context(save_graphs=0)
    (ir,) = tmp_path.glob("*_validate_*.ir")
    assert {op for op, _ in ir_nodes(ir).values() if op.startswith("Inplace")} == kernels
