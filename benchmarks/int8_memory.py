"""Peak host memory of an eval forward with the weights held in float32, float16 and int8,
and of LoRA training steps over an fp16 and an int8 frozen base (issue 30).

Eval: the real Llama 3.2 1B shape (hidden 2048, 16 layers, the full 128,256-token
vocabulary) with random weights, one forward of 1 x 512 tokens through eval's own cells
(the model eval builds, model/int8_linear.py's cells for int8, the chunked head+loss), in
its own child process each. The embedding and norms are fp16 in the int8 child, as
`quantize` stores them and eval holds them. LoRA: `llama-npu train` in process, O2 fp16,
over the 1B shape cut to a few layers so that it trains on this machine.

Eval's cells keep the int8 model's transients small: each linear layer dequantizes 2^21 weights
at a time (model/int8_linear.py), and the LM head casts its fp16 weight 8,192 vocabulary rows at a
time (model/chunked_loss.py), so the fp16 and int8 children hold no fp32 copy of a whole matrix.

Each eval child runs in PYNATIVE_MODE: the CPU backend frees a kernel's transient buffers there,
while a GRAPH_MODE graph keeps every buffer it allocates (docs/profiling-and-benchmarks.md:
chunked CE peaked at 4.59 GiB in PyNative against 13.70 GiB in GRAPH mode), which would hide
one layer's transient dequantized weight under everything else. Each child records its own
baseline (VmHWM after the imports and the tokenizer load, before the model is built) and its
peak (VmHWM at the end). Host memory on MindSpore's CPU backend, not NPU memory (FACTS.md).

    .venv/bin/python benchmarks/int8_memory.py [--seq 512] [--lora-layers 4] [--lora-seq 256]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GIB = 2**30
TEXT = "黄河发源于青海省，流经九个省区，最后注入渤海。"


def child_setup():
    """MindSpore on the CPU in PyNative, the tokenizer loaded: (ms, tokenizer, baseline VmHWM)."""
    from llama_npu.common.frameworks import mute_mindformers_info, quiet_frameworks

    quiet_frameworks(Path(tempfile.gettempdir()) / "llama-npu-logs" / "benchmarks")
    import mindspore as ms

    from llama_npu.data.tokenizer import load_tokenizer
    from llama_npu.memory.measure import host_peak_rss

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    mute_mindformers_info()
    tokenizer = load_tokenizer("llama3.2")
    return ms, tokenizer, host_peak_rss()


def random_int8(shape, rng):
    """(name, q, s) of every decoder linear weight of `shape`: random int8, one scale a row."""
    import numpy as np

    from llama_npu.weights.pretrained import expected_tensors
    from llama_npu.weights.tensor_files import LINEAR

    for name, dims in expected_tensors(shape).items():
        if LINEAR.match(name):
            yield name, rng.integers(-127, 128, dims, dtype=np.int8), np.full(dims[0], 0.06 / 127, np.float32)


def fill_floats(ms, net, rng) -> None:
    """Random values into the float Parameters (built without data), a block of rows at a
    time in their own dtype, so that no float64 or float32 copy of a whole matrix exists."""
    import numpy as np

    for param in net.get_parameters():
        if param.dtype == ms.int8 or param.name.endswith("int8_scale"):
            continue
        dtype = np.float16 if param.dtype == ms.float16 else np.float32
        if "norm" in param.name:
            param.set_data(ms.Tensor(np.ones(param.shape, dtype)))
            continue
        values = np.empty(param.shape, dtype)
        for start in range(0, param.shape[0], 4096):
            values[start:start + 4096] = 0.02 * rng.standard_normal(values[start:start + 4096].shape, np.float32)
        param.set_data(ms.Tensor.from_numpy(values))  # shares the array: no second copy


def eval_child(weights: str, seq: int) -> dict:
    """One eval forward of 1 x seq tokens of the 1B shape with its weights held as `weights`."""
    ms, tokenizer, baseline = child_setup()
    import numpy as np
    from mindspore.nn.utils import no_init_parameters

    from llama_npu.evaluation.loaded_model import EVAL_CHUNK, inference_recipe
    from llama_npu.evaluation.perplexity import ChunkwiseLoss
    from llama_npu.memory.measure import host_peak_rss
    from llama_npu.model.architecture import PRESETS
    from llama_npu.strategies.network import build_network
    from llama_npu.weights.int8_weights import install_int8

    ids = (tokenizer.encode(TEXT * (seq // 8 + 1), add_special_tokens=False).ids)[:seq + 1]
    shape, rng = PRESETS["llama3.2-1b"], np.random.default_rng(0)
    with no_init_parameters():  # as eval builds an int8 model: nothing allocated before it is filled
        net, loss_cell = build_network(inference_recipe(shape, seq, 1), on_ascend=False, variable_length=True,
                                       param_dtype="float32" if weights == "float32" else "float16")
    if weights == "int8":
        install_int8(net, random_int8(shape, rng), "dequant")
    fill_floats(ms, net, rng)
    held = sum(p.nbytes for p in net.get_parameters())
    batch = ms.Tensor(np.array([ids], np.int32))
    loss = float(ChunkwiseLoss(loss_cell, EVAL_CHUNK)(batch, batch))
    return {"baseline": baseline, "peak": host_peak_rss(), "held": held, "loss": loss}


def lora_child(base: str, layers: int, seq: int, steps: int) -> dict:
    """`llama-npu train` of LoRA over an fp16 or int8 base of the 1B shape cut to `layers`, in the
    train step's GRAPH_MODE: its PyNative step stopped on MindSpore 2.9.0's CPU backend ("All input
    must have the same data type", a Stack of a Ref and a Tensor) with the fp16 base too."""
    _, _, baseline = child_setup()
    from llama_npu.cli import main
    from llama_npu.common.console import note
    from llama_npu.memory.measure import current_rss, host_peak_rss

    sets = ["model.preset=llama3.2-1b", f"model.num_layers={layers}", f"data.max_seq_len={seq}",
            "data.eval_files=[]", "train.micro_batch_size=1", "train.global_batch_size=1", f"train.max_steps={steps}",
            f"train.save_every={steps}", "train.warmup_steps=1",
            "strategies.precision.amp_level=O2", "strategies.lora.enabled=true",
            f"strategies.lora.base_dtype={'int8' if base == 'int8' else 'compute'}"]
    with tempfile.TemporaryDirectory() as out:
        code = main(["train", str(REPO / "recipes" / "cpu_smoke.yaml"), "--output-dir", str(Path(out) / "run"),
                     *[a for s in sets for a in ("--set", s)]])
        note(f"train exited {code}")
        return {"baseline": baseline, "peak": host_peak_rss(), "after_steps": current_rss(), "exit": code}


def run_child(*args) -> dict:
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                                                    os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, __file__, "--child", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"child {args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def planner_lines(seq: int) -> list:
    """The planner's inference estimate (memory/planner.py estimate_inference) of the same shape on
    the 910A, whose int8 layers run the cast-and-scale kernel these children run on the CPU."""
    from llama_npu.memory.devices import DEVICES
    from llama_npu.memory.planner import estimate_inference, split_params
    from llama_npu.model.architecture import PRESETS

    shape = PRESETS["llama3.2-1b"]
    split = split_params(shape)
    params = split["embedding"] + shape.num_layers * (split["layer_matrices"] + split["layer_norms"]) \
        + split["final_norm"]
    plans = {p: estimate_inference(shape, params, DEVICES["910a"], p, 1, seq) for p in ("fp32", "fp16", "int8")}
    totals = {p: plan.total_bytes - plan.components["margin"] for p, plan in plans.items()}
    return [f"planner (estimate_inference, 910A, 1 x {seq}, without its margin): " + ", ".join(
        f"{p} weights {plans[p].components['weights'] / GIB:.2f} GiB, total {totals[p] / GIB:.2f} GiB" for p in plans),
        f"planner int8/fp16 total: {totals['int8'] / totals['fp16']:.3f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=512, help="tokens of the eval forward")
    parser.add_argument("--lora-layers", type=int, default=4, help="decoder layers of the LoRA runs' 1B shape")
    parser.add_argument("--lora-seq", type=int, default=256)
    parser.add_argument("--lora-steps", type=int, default=2)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, value = args.child[0], args.child[1]
        print(json.dumps(eval_child(value, args.seq) if kind == "eval" else
                         lora_child(value, args.lora_layers, args.lora_seq, args.lora_steps)))
        return
    print(f"Llama 3.2 1B shape, random weights, one eval forward of 1 x {args.seq} tokens, each in its own child "
          f"process, PYNATIVE_MODE on MindSpore's CPU backend; host memory (VmHWM), not NPU memory")
    evals = {w: run_child("eval", w, "--seq", args.seq) for w in ("float32", "float16", "int8")}
    for w, r in evals.items():
        print(f"eval {w:<8} weights held {r['held'] / GIB:.2f} GiB; baseline {r['baseline'] / GIB:.2f} GiB, peak "
              f"{r['peak'] / GIB:.2f} GiB, above baseline {(r['peak'] - r['baseline']) / GIB:.2f} GiB "
              f"(loss {r['loss']:.3f})")
    for line in planner_lines(args.seq):
        print(line)
    print(f"LoRA rank 8 (wq wk wv wo), O2 fp16, {args.lora_layers} of the 1B shape's layers, 1 x {args.lora_seq} "
          f"tokens, {args.lora_steps} steps, GRAPH_MODE (the train step's):")
    loras = {b: run_child("lora", b, "--lora-layers", args.lora_layers, "--lora-seq", args.lora_seq,
                          "--lora-steps", args.lora_steps) for b in ("float16", "int8")}
    for b, r in loras.items():
        print(f"LoRA over a {b:<7} base: baseline {r['baseline'] / GIB:.2f} GiB, peak {r['peak'] / GIB:.2f} GiB, "
              f"resident after the steps {r['after_steps'] / GIB:.2f} GiB")
    above = {b: r["peak"] - r["baseline"] for b, r in loras.items()}
    print(f"LoRA int8/fp16 base peak above baseline: {above['int8'] / above['float16']:.3f}; resident after the "
          f"steps: {loras['int8']['after_steps'] / loras['float16']['after_steps']:.3f}")
    print(f"int8/fp16 eval whole-process peak: {evals['int8']['peak'] / evals['float16']['peak']:.3f}")
    above = {w: r["peak"] - r["baseline"] for w, r in evals.items()}
    print(f"int8/fp16 eval peak above baseline: {above['int8'] / above['float16']:.3f}")


if __name__ == "__main__":
    main()
