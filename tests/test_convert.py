"""Hugging Face weights in and out, checked against the reference implementation
(`transformers` on a CPU build of torch)."""
import json
import re

import numpy as np
import pytest
import torch  # the test extra's reference implementation: a missing torch is an error, never a skip
import transformers

from llama_npu.weights.tensor_files import read_safetensors

from llama_npu.recipe.load import load_recipe, recipe_from_dict
from llama_npu.training.rehearse import STEPS as REHEARSAL_STEPS

from conftest import LORA_RECIPE, REPO, SMOKE, read_metrics, rehearsal_sets, run_cli
from test_shipped_recipes import shrunk


def logits_of(ms, net, tokens):
    """(B, T, V) logits of our MindFormers model for int32 `tokens` (B, T)."""
    from mindspore import nn

    class Logits(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.backbone, self.head = net.model, net.lm_head

        def construct(self, ids):
            return self.head(self.backbone(ids))

    return Logits()(ms.Tensor(tokens)).asnumpy().reshape(*tokens.shape, -1)


def test_converted_logits_equal_transformers(ms, hf_dir, conversions):
    from llama_npu.recipe.load import load_recipe
    from llama_npu.strategies.network import build_network

    _, reference = hf_dir
    out = conversions["float32"]
    recipe = load_recipe(SMOKE, ["data.max_seq_len=24", f"model.checkpoint={out}"])
    net, _ = build_network(recipe, on_ascend=False)

    tokens = np.random.default_rng(0).integers(0, 128000, (2, 24)).astype(np.int32)
    ours = logits_of(ms, net, tokens)
    with torch.no_grad():
        theirs = reference(torch.from_numpy(tokens.astype(np.int64))).logits.numpy()
    assert np.abs(ours - theirs).max() < 1e-4


@pytest.mark.quick
def test_round_trip_is_bit_exact_and_transformers_loads_it(hf_dir, tmp_path):
    src, reference = hf_dir
    there = run_cli("convert", "hf-to-ms", "--src", src, "--dst", tmp_path / "ms", check=True)
    back_again = run_cli("convert", "ms-to-hf", "--src", tmp_path / "ms", "--dst", tmp_path / "back", check=True)
    for proc in (there, back_again):  # what it is doing, and how far along
        assert "[llama-npu] writing" in proc.stdout and re.search(r"convert: .*\d+/\d+ \[", proc.stderr)
    original = read_safetensors(src / "model.safetensors")
    back = read_safetensors(tmp_path / "back" / "model.safetensors")
    assert original.keys() - {"lm_head.weight"} == back.keys()
    for name in back:
        assert original[name][0] == back[name][0]
        assert original[name][1].tobytes() == back[name][1].tobytes(), name
    reloaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "back").eval()
    tokens = torch.tensor([[128000, 57668, 53901, 3922]])
    with torch.no_grad():
        assert torch.equal(reloaded(tokens).logits, reference(tokens).logits)


def test_fine_tune_exports_back_to_hugging_face(shrunk_run, conversions, tmp_path):
    """From the run directory (its newest step) or from --weights of that step: the same export."""
    run, proc = shrunk_run(SMOKE, "float32")  # the smoke recipe's rehearsal, from the conversion
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_cli("convert", "ms-to-hf", "--src", run, "--dst", tmp_path / "tuned", check=True)
    run_cli("convert", "ms-to-hf", "--src", conversions["float32"], "--weights",
            run / "checkpoints" / f"step_{REHEARSAL_STEPS}" / "model.ckpt", "--dst", tmp_path / "by-weights", check=True)
    assert json.loads((tmp_path / "tuned" / "config.json").read_text())["tie_word_embeddings"] is True
    assert (tmp_path / "tuned" / "model.safetensors").read_bytes() == \
        (tmp_path / "by-weights" / "model.safetensors").read_bytes()
    assert (tmp_path / "tuned" / "tokenizer.json").is_file()


@pytest.mark.parametrize("breakage, message", [
    ("config", "no config.json"),
    ("shard", "model-00002-of-00002.safetensors: shard listed in the index is missing"),
    ("tokenizer", "tokenizer.json: not the Llama 3.2 tokenizer (token '!' maps to 5"),
    ("shape", "tensor model.layers.0.self_attn.k_proj.weight has shape (32, 64), but config.json implies (16, 64)"),
    ("rope", "rope_scaling must be of rope_type 'llama3'"),
])
def test_bad_sources_name_file_and_tensor_and_write_nothing(hf_dir, tmp_path, breakage, message):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(hf_dir[0], src)
    config = json.loads((src / "config.json").read_text())
    if breakage == "config":
        (src / "config.json").unlink()
    elif breakage == "shard":
        weights = json.loads(json.dumps({"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors",
                                                        "model.embed_tokens.weight": "model.safetensors"}}))
        (src / "model.safetensors.index.json").write_text(json.dumps(weights))
    elif breakage == "tokenizer":
        tokenizer = {"model": {"vocab": {"!": 5}}}
        (src / "tokenizer.json").write_text(json.dumps(tokenizer))
    elif breakage == "shape":
        config["num_key_value_heads"] = 1
        (src / "config.json").write_text(json.dumps(config))
    else:
        config["rope_scaling"] = None
        (src / "config.json").write_text(json.dumps(config))
    proc = run_cli("convert", "hf-to-ms", "--src", src, "--dst", tmp_path / "out")
    assert proc.returncode == 2 and message in proc.stderr
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


@pytest.mark.quick
def test_eval_with_its_defaults_gives_the_reference_loss(hf_dir, conversions, tmp_path):
    """Defaults: --max-seq-len 2048 and --batch-size 4, each batch padded only to its bucket."""
    from llama_npu.data.tokenizer import load_tokenizer

    _, reference = hf_dir
    texts = ["长江是中国最长的河流。", "Llama 3.2 有 1B 和 3B 两个版本。", "今天天气很好，我们去公园散步吧。"]
    data = tmp_path / "texts.jsonl"
    data.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
    proc = run_cli("eval", "--checkpoint", conversions["float32"], "--data", data, "--json", check=True)
    ours = json.loads(proc.stdout)

    tok = load_tokenizer("llama3.2")
    total, count = 0.0, 0
    with torch.no_grad():
        for text in texts:
            ids = [128000] + tok.encode(text, add_special_tokens=False).ids + [128001]
            batch = torch.tensor([ids])
            loss = reference(batch, labels=batch).loss.item()  # mean over len(ids) - 1 predictions
            total, count = total + loss * (len(ids) - 1), count + len(ids) - 1
    assert ours["target_tokens"] == count and ours["evaluated"] == 3
    assert ours["loss"] == pytest.approx(total / count, rel=1e-5)
    assert ours["perplexity"] == pytest.approx(np.exp(total / count), rel=1e-4)


@pytest.mark.quick
def test_greedy_generate_matches_transformers(hf_dir, conversions, ms):
    from llama_npu.data.tokenizer import load_tokenizer
    from llama_npu.evaluation.generate import STOP_IDS, generate, prompt_ids

    _, reference = hf_dir
    streamed = []
    ours = generate(conversions["float32"], "你好，请介绍一下长城。", system="你是一位导游。", max_new_tokens=8,
                    on_text=streamed.append)
    ids = prompt_ids(load_tokenizer("llama3.2"), "你好，请介绍一下长城。", "你是一位导游。")
    with torch.no_grad():
        out = reference.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                                 eos_token_id=list(STOP_IDS), pad_token_id=128004)
    theirs = [t for t in out[0, len(ids):].tolist() if t not in STOP_IDS]
    assert ours == theirs and len(ours) > 0
    assert "".join(streamed) == load_tokenizer("llama3.2").decode(ours).rstrip("\ufffd")


def test_int8_quantization_size_and_loss(shrunk_run, conversions, tmp_path):
    """Quantize a briefly fine-tuned tiny model: the size drops as computed and the held-out
    loss moves by a small amount (eval reports both losses, and quantize --data the same two)."""
    from llama_npu.memory.planner import split_params
    from llama_npu.model.architecture import PRESETS

    base = conversions["float32"]
    run, _ = shrunk_run(SMOKE, "float32")  # its rehearsal at lr 0.05 from the conversion
    tuned = run / "checkpoints" / f"step_{REHEARSAL_STEPS}"  # a step directory is a checkpoint eval/quantize take
    held_out = str(REPO / "data" / "zh_instruct_eval.jsonl")
    proc = run_cli("quantize", "--checkpoint", tuned, "--dst", tmp_path / "int8", "--data", held_out,
                   "--max-seq-len", "64", check=True)
    split = split_params(PRESETS["tiny"])  # the test model has the tiny preset's shape
    linear = 2 * split["layer_matrices"]
    out_channels = 2 * (3 * 64 + 2 * 32 + 2 * 128)
    everything = split["embedding"] + 2 * (split["layer_matrices"] + split["layer_norms"]) + split["final_norm"]
    after = linear + 4 * out_channels + 2 * (everything - linear)  # int8 + fp32 scales + fp16 rest
    assert f"{4 * everything:,} bytes -> {after:,} bytes" in proc.stdout
    losses = {}
    for name, path in (("tuned", tuned), ("base", base)):
        out = run_cli("eval", "--checkpoint", path, "--data", held_out, "--max-seq-len", "64", "--json", check=True)
        losses[name] = json.loads(out.stdout)["loss"]
    assert losses["tuned"] < losses["base"]  # the fine-tune learned something
    # quantize --data reports eval's figure for the float model (and, by the same code, the int8 one's)
    reported = dict(re.findall(r"^(float|int8) +([\d.]+) +[\d.]+$", proc.stdout, re.M))
    assert float(reported["float"]) == pytest.approx(losses["tuned"], abs=1e-4)
    delta = float(re.search(r"int8 - float: loss ([-+][\d.]+)", proc.stdout).group(1))
    assert float(reported["int8"]) == pytest.approx(float(reported["float"]) + delta, abs=2e-4)
    assert delta != 0 and abs(delta) < 0.01 * losses["tuned"]  # int8 moves the loss, a little


def test_quantize_checks_its_accuracy_inputs_before_writing(conversions, tmp_path):
    """A --task without its directory, or unreadable --data, is one line and exit 2, before the
    int8 directory is written."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\nnot json\n', encoding="utf-8")
    for extra, expected in ((["--data", bad], f"{bad}:2"),
                            (["--data", bad, "--task", "ceval"], "--task and --task-data: give both")):
        proc = run_cli("quantize", "--checkpoint", conversions["float32"], "--dst", tmp_path / "int8", *extra)
        assert proc.returncode == 2 and expected in proc.stderr, proc.stderr
        assert not (tmp_path / "int8").exists()


# ---------------------------------------------------------------- shipped recipes from converted weights

def precision_group(path) -> str:
    """What decides the network's parameter dtypes: amp level, dtype and LoRA."""
    recipe = load_recipe(path)
    p = recipe.strategies.precision
    dtype = "float32" if p.amp_level == "O0" else "float16"  # bfloat16 runs as float16 here
    return f"{p.amp_level}-{dtype}{'-lora' if recipe.strategies.lora.enabled else ''}"


SHIPPED = sorted((REPO / "recipes").glob("*.yaml"))
GROUPS = {}
# LORA_RECIPE first in its group: its float32 run is the one lora_export trains anyway
for _path in sorted(SHIPPED, key=lambda p: p != LORA_RECIPE):
    GROUPS.setdefault(precision_group(_path), []).append(_path)


@pytest.mark.parametrize("group", sorted(GROUPS))
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_shipped_recipes_train_from_float32_and_float16_conversions(shrunk_run, group, dtype):
    """Every shipped recipe, shrunk, starts from both conversions with its own precision.

    To keep the suite short the recipes are grouped by what decides the dtype of each
    Parameter a checkpoint loads into (amp level, dtype, LoRA) and the first recipe of each
    group trains its rehearsal's steps: O0 stores everything in float32; O2 stores float32 parameters and
    computes in float16; O2 with LoRA stores the frozen base in float16 but the norms in
    float32. The bfloat16 recipes (910B) store what their float16 group stores and run as
    it here: the CPU has no bfloat16 kernels."""
    out, proc = shrunk_run(GROUPS[group][0], dtype)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(1, REHEARSAL_STEPS + 1))
    assert all(np.isfinite(r["loss"]) for r in rows)


def test_a_mismatched_checkpoint_is_one_line_naming_the_tensor(ms, conversions, tmp_path):
    """check_pretrained reads config.json and the tensor headers (after the checksums), before any data is
    tokenized."""
    import shutil

    from llama_npu.common.checksums import write_manifest
    from llama_npu.checkpoints.files import CheckpointError
    from llama_npu.weights.pretrained import check_pretrained, tensor_index

    broken = tmp_path / "broken"
    shutil.copytree(conversions["float16"], broken)
    weights = ms.load_checkpoint(str(broken / "model.ckpt"))
    assert tensor_index(broken / "model.ckpt") == {k: tuple(v.shape) for k, v in weights.items()}
    recipe = load_recipe(SMOKE, [f"model.checkpoint={broken}"])
    check_pretrained(recipe)  # intact: no error

    def rewrite(**changes):
        (broken / "model.ckpt").chmod(0o600)  # saved read-only
        tensors = {k: v for k, v in dict(weights, **changes).items() if v is not None}
        ms.save_checkpoint([{"name": k, "data": v} for k, v in tensors.items()], str(broken / "model.ckpt"),
                           crc_check=True)
        write_manifest(broken, "a wrong tensor, sealed as sound")  # the shape check, not the checksum's, is tested

    rewrite(**{"model.layers.1.attention.wk.weight": ms.Tensor(np.zeros((16, 64)), ms.float16)})
    with pytest.raises(CheckpointError, match=r"model\.ckpt: tensor model\.layers\.1\.attention\.wk\.weight has "
                                              r"shape \(16, 64\), the model needs \(32, 64\)$"):
        check_pretrained(recipe)
    rewrite(**{"model.norm_out.weight": None, "model.layers.1.attention.wk.weight": None})
    with pytest.raises(CheckpointError, match=r"model\.ckpt: lacks tensor model\.norm_out\.weight \(2 of 20 "):
        check_pretrained(recipe)


def test_the_tiny_conversion_given_to_a_1b_recipe_names_the_recipe_to_use(conversions, tmp_path):
    """The README's Hugging Face steps tried on scripts/make_tiny_hf_model.py's model: the 1B recipe
    refuses its shape in one line that says which preset it is and which shipped recipe has it."""
    proc = run_cli("validate", REPO / "recipes" / "llama3_2_1b_zh_full_910b.yaml", "--output-dir", tmp_path / "run",
                   "--set", f"model.checkpoint={conversions['float32']}")
    assert proc.returncode == 2
    assert (f"model.checkpoint={conversions['float32']} holds hidden 64, 2 layers, 4 heads / 2 KV heads, MLP 128, "
            f"vocab 128,256, but model.preset=llama3.2-1b is hidden 2048") in proc.stderr
    assert "; it is model.preset: tiny, as in recipes/cpu_smoke.yaml" in proc.stderr


# ---------------------------------------------------------------- LoRA run directories

def test_a_lora_run_exports_merged_weights_and_its_tokenizer(ms, hf_dir, conversions, lora_export, tmp_path):
    """transformers' logits of the export equal ours with the adapters applied, its
    AutoTokenizer encodes as ours does, and the --weights --merge-lora form is identical."""
    from llama_npu.data.tokenizer import load_tokenizer
    from llama_npu.strategies.network import build_network

    run, export = lora_export
    step = run / "checkpoints" / f"step_{REHEARSAL_STEPS}" / "model.ckpt"
    rehearsal = shrunk(LORA_RECIPE, *rehearsal_sets(conversions["float32"]))
    recipe = recipe_from_dict(rehearsal.to_dict(), ["strategies.precision.amp_level=O0",
                                                      "strategies.precision.loss_scale=none", "data.max_seq_len=16"])
    net, _ = build_network(recipe, on_ascend=False)
    ms.load_param_into_net(net, ms.load_checkpoint(str(step)))
    tokens = np.random.default_rng(1).integers(0, 128000, (1, 16)).astype(np.int32)
    ours = logits_of(ms, net, tokens)
    with torch.no_grad():
        theirs = transformers.LlamaForCausalLM.from_pretrained(export).eval()(torch.from_numpy(tokens.astype(np.int64)))
        base_logits = hf_dir[1](torch.from_numpy(tokens.astype(np.int64))).logits.numpy()
    assert np.abs(ours - theirs.logits.numpy()).max() < 1e-4
    assert np.abs(theirs.logits.numpy() - base_logits).max() > 1e-3  # the adapters did change the model

    text = "长江是中国最长的河流。Llama 3.2"
    tokenizer = transformers.AutoTokenizer.from_pretrained(export)
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == load_tokenizer("llama3.2").encode(
        text, add_special_tokens=False).ids

    run_cli("convert", "ms-to-hf", "--src", conversions["float32"], "--weights", step, "--merge-lora",
            "--dst", tmp_path / "merged", "--dtype", "float32", check=True)
    assert (tmp_path / "merged" / "model.safetensors").read_bytes() == (export / "model.safetensors").read_bytes()


def test_eval_and_generate_take_a_lora_run_directory(lora_export, tmp_path):
    """Both fold the adapters into the base the run's recipe names: the loss and the greedy
    reply equal transformers' on the merged export."""
    from llama_npu.data.tokenizer import load_tokenizer
    from llama_npu.evaluation.generate import STOP_IDS, prompt_ids

    run, export = lora_export
    merged = transformers.LlamaForCausalLM.from_pretrained(export).eval()
    texts = ["长江是中国最长的河流。", "今天天气很好，我们去公园散步吧。"]
    data = tmp_path / "texts.jsonl"
    data.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
    ours = json.loads(run_cli("eval", "--checkpoint", run, "--data", data, "--json", check=True).stdout)
    tok = load_tokenizer("llama3.2")
    total, count = 0.0, 0
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([[128000] + tok.encode(text, add_special_tokens=False).ids + [128001]])
            total, count = total + merged(ids, labels=ids).loss.item() * (ids.shape[1] - 1), count + ids.shape[1] - 1
    assert ours["target_tokens"] == count and ours["loss"] == pytest.approx(total / count, rel=1e-5)

    proc = run_cli("generate", "--checkpoint", run, "--prompt", "你好", "--max-new-tokens", "6", check=True)
    ids = prompt_ids(tok, "你好")
    with torch.no_grad():
        out = merged.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False, eos_token_id=list(STOP_IDS),
                              pad_token_id=128004)
    theirs = [t for t in out[0, len(ids):].tolist() if t not in STOP_IDS]
    # print's own newline only: the reply itself may end in one (it does since data.truncation's keep_end)
    assert proc.stdout.removesuffix("\n") == tok.decode(theirs).rstrip("\ufffd")


def test_asking_eval_for_an_npu_the_host_lacks_is_one_line():
    """Before anything is read (tests/test_cli.py checks every option's help text)."""
    proc = run_cli("eval", "--checkpoint", REPO / "no-such-run", "--data", REPO / "data" / "zh_instruct_eval.jsonl",
                   "--device", "ascend")
    assert proc.returncode == 2 and proc.stderr.startswith("llama-npu: error: --device ascend: MindSpore reports "
                                                           "no usable Ascend device")


def test_a_run_started_with_relative_paths_evaluates_from_any_directory(shrunk_run):
    """Paths are resolved where the run starts and stored absolute in its recipe.yaml, so eval
    on a LoRA run finds the base its recipe names from another directory."""
    run, proc = shrunk_run(LORA_RECIPE, "float32")  # started in its directory with relative paths
    assert proc.returncode == 0, proc.stderr[-3000:]
    work = run.parent
    stored = load_recipe(run / "recipe.yaml")
    assert stored.model.checkpoint == str(work / "weights" / "float32")
    assert stored.data.train_files == [str(work / "data" / "zh_instruct_train.jsonl")]
    proc = run_cli("eval", "--checkpoint", f"{work.name}/{run.name}", "--data", REPO / "data" / "zh_instruct_eval.jsonl",
                   "--json", cwd=work.parent, check=True)
    # At the run's own max_seq_len, eval of the run is its held-out loss over the same tokens
    # (the run evaluated in its mixed precision, eval in float32).
    result, summary = json.loads(proc.stdout), json.loads((run / "summary.json").read_text())
    assert (result["max_seq_len"], result["max_seq_len_from"]) == (stored.data.max_seq_len, "the run's data.max_seq_len")
    assert result["target_tokens"] == summary["eval_tokens"]
    assert result["loss"] == pytest.approx(summary["eval_loss"], rel=1e-3)


def test_a_terminated_conversion_leaves_nothing(hf_dir, tmp_path):
    """SIGTERM (a scheduler's stop, `kill`) while hf-to-ms writes: one line, 128 + 15, and
    neither the destination nor its hidden staging directory remains."""
    import signal
    import subprocess
    import sys
    import time

    config = transformers.LlamaConfig.from_pretrained(hf_dir[0])
    config.update({"hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8, "head_dim": 64})
    src = tmp_path / "hf"  # a 128,256 x 512 embedding: long enough a write to be cut off (seconds)
    transformers.LlamaForCausalLM(config).save_pretrained(src, safe_serialization=True)
    dst = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "llama_npu", "convert", "hf-to-ms", "--src", src, "--dst", dst],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while not list(tmp_path.glob(".out.partial-*")) and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    stderr = proc.communicate(timeout=60)[1]
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert stderr.strip().splitlines()[-1] == "llama-npu: error: interrupted (SIGTERM)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_a_lora_run_prints_no_framework_info_lines(shrunk_run):
    """mindpet logs each freeze step at INFO on stdout unless told not to."""
    _, proc = shrunk_run(LORA_RECIPE, "float32")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [line for line in proc.stdout.splitlines() if line.startswith("[INFO]")] == []
    assert proc.stdout.splitlines()[-1].startswith("not rehearsed")  # the summary ends stdout


def exported_dtypes(export) -> tuple:
    """(the dtype codes of the export's tensors, its config.json's torch_dtype)."""
    tensors = read_safetensors(export / "model.safetensors")
    return {code for code, _ in tensors.values()}, json.loads((export / "config.json").read_text())[
        "torch_dtype"]


def test_a_runs_export_is_in_the_dtype_it_started_from_else_the_one_it_computed_in(shrunk_run, hf_dir, tmp_path):
    """LLaMA-Factory's export writes the model config's torch_dtype, a half dtype when that is
    fp32 (train/tuner.py): a run's fp32 master weights are no reason to write fp32."""
    import shutil

    import yaml
    run, proc = shrunk_run(LORA_RECIPE, "float32")  # O2 float16 over an fp32 source
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_cli("convert", "ms-to-hf", "--src", run, "--dst", tmp_path / "computed", check=True)
    assert exported_dtypes(tmp_path / "computed") == ({"F16"}, "float16")
    assert ("in float16 (the run started from a float32 model, so the dtype it computed in (strategies.precision "
            "amp_level O2, dtype float16); --dtype writes another)") in proc.stdout
    proc = run_cli("convert", "ms-to-hf", "--src", run, "--dst", tmp_path / "asked", "--dtype", "float32", check=True)
    assert exported_dtypes(tmp_path / "asked") == ({"F32"}, "float32") and "in float32 (--dtype)" in proc.stdout
    # the same run, had it started from a bf16 model (its config's torch_dtype, kept by hf-to-ms): bf16
    source = tmp_path / "bf16-source"
    shutil.copytree(hf_dir[0], source)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16", "dtype": "bfloat16"}))
    run_cli("convert", "hf-to-ms", "--src", source, "--dst", tmp_path / "bf16-ms", check=True)
    assert json.loads((tmp_path / "bf16-ms" / "config.json").read_text())["hf_config"]["torch_dtype"] == "bfloat16"
    started = tmp_path / "run"
    shutil.copytree(run, started)
    recipe = yaml.safe_load((started / "recipe.yaml").read_text())
    recipe["model"]["checkpoint"] = str(tmp_path / "bf16-ms")
    (started / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    proc = run_cli("convert", "ms-to-hf", "--src", started, "--dst", tmp_path / "started", check=True)
    assert exported_dtypes(tmp_path / "started") == ({"BF16"}, "bfloat16")
    assert f"in bfloat16 (the dtype of the model the run started from ({tmp_path / 'bf16-ms'}: bfloat16))" in proc.stdout
