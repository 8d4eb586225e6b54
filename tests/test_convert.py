"""Hugging Face weights in and out, checked against the reference implementation
(`transformers` on a CPU build of torch)."""
import json
import re

import numpy as np
import pytest

from llama_npu.convert import read_safetensors

from conftest import REPO, SMOKE, TINY_RUN, read_metrics, run_cli

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


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


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny random Llama 3.2 (llama3 RoPE scaling, GQA 4/2, tied embeddings) saved by transformers."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192}, tie_word_embeddings=True,
        bos_token_id=128000, eos_token_id=128009)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # make the norms non-trivial so a misplaced norm weight shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("hf") / "tiny-llama3.2"
    model.save_pretrained(path, safe_serialization=True)
    from llama_npu.data.tokenizer import default_tokenizer_path

    (path / "tokenizer.json").write_bytes(default_tokenizer_path().read_bytes())  # as a real download has
    return path, model


def test_converted_logits_equal_transformers(ms, hf_dir, tmp_path):
    from llama_npu.build import build_network
    from llama_npu.recipe import load_recipe

    src, reference = hf_dir
    out = tmp_path / "ms"
    run_cli("convert", "hf-to-ms", "--src", src, "--dst", out, check=True)
    recipe = load_recipe(SMOKE, ["data.max_seq_len=24", f"model.checkpoint={out}"])
    net, _ = build_network(recipe, on_ascend=False)

    tokens = np.random.default_rng(0).integers(0, 128000, (2, 24)).astype(np.int32)
    ours = logits_of(ms, net, tokens)
    with torch.no_grad():
        theirs = reference(torch.from_numpy(tokens.astype(np.int64))).logits.numpy()
    assert np.abs(ours - theirs).max() < 1e-4


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


def test_fine_tune_from_converted_weights(hf_dir, tmp_path):
    src, _ = hf_dir
    run_cli("convert", "hf-to-ms", "--src", src, "--dst", tmp_path / "ms", check=True)
    run_cli("train", SMOKE, "--output-dir", tmp_path / "run", *TINY_RUN, "--set", f"model.checkpoint={tmp_path / 'ms'}",
            "--set", "train.max_steps=2", check=True)
    assert len(read_metrics(tmp_path / "run")) == 2
    # and back to Hugging Face format from the fine-tuned step
    run_cli("convert", "ms-to-hf", "--src", tmp_path / "ms", "--weights",
            tmp_path / "run" / "checkpoints" / "step_2" / "model.ckpt", "--dst", tmp_path / "tuned", check=True)
    assert json.loads((tmp_path / "tuned" / "config.json").read_text())["tie_word_embeddings"] is True


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


def test_eval_loss_equals_the_reference_loss(hf_dir, tmp_path):
    from llama_npu.data.tokenizer import load_tokenizer

    src, reference = hf_dir
    run_cli("convert", "hf-to-ms", "--src", src, "--dst", tmp_path / "ms", check=True)
    texts = ["长江是中国最长的河流。", "Llama 3.2 有 1B 和 3B 两个版本。", "今天天气很好，我们去公园散步吧。"]
    data = tmp_path / "texts.jsonl"
    data.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
    proc = run_cli("eval", "--checkpoint", tmp_path / "ms", "--data", data, "--max-seq-len", "32",
                   "--batch-size", "2", "--json", check=True)
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


def test_greedy_generate_matches_transformers(hf_dir, tmp_path, ms):
    from llama_npu.data.tokenizer import load_tokenizer
    from llama_npu.generate import STOP_IDS, generate, prompt_ids

    src, reference = hf_dir
    run_cli("convert", "hf-to-ms", "--src", src, "--dst", tmp_path / "ms", check=True)
    streamed = []
    ours = generate(tmp_path / "ms", "你好，请介绍一下长城。", system="你是一位导游。", max_new_tokens=8,
                    on_text=streamed.append)
    ids = prompt_ids(load_tokenizer("llama3.2"), "你好，请介绍一下长城。", "你是一位导游。")
    with torch.no_grad():
        out = reference.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                                 eos_token_id=list(STOP_IDS), pad_token_id=128004)
    theirs = [t for t in out[0, len(ids):].tolist() if t not in STOP_IDS]
    assert ours == theirs and len(ours) > 0
    assert "".join(streamed) == load_tokenizer("llama3.2").decode(ours).rstrip("\ufffd")


def test_int8_quantization_size_and_loss(hf_dir, tmp_path):
    """Quantize a briefly fine-tuned tiny model: the size drops as computed and the held-out
    loss moves by a small amount (eval reports both losses)."""
    from llama_npu.memory.planner import split_params
    from llama_npu.model import PRESETS

    src, _ = hf_dir
    run_cli("convert", "hf-to-ms", "--src", src, "--dst", tmp_path / "base", check=True)
    run_cli("train", SMOKE, "--output-dir", tmp_path / "run", *TINY_RUN, "--set", f"model.checkpoint={tmp_path / 'base'}",
            "--set", "train.max_steps=8", "--set", "train.optimizer.lr=1e-2", check=True)
    tuned = tmp_path / "run" / "checkpoints" / "step_8"  # a step directory is a checkpoint eval/quantize take
    proc = run_cli("quantize", "--checkpoint", tuned, "--dst", tmp_path / "int8", check=True)
    split = split_params(PRESETS["tiny"])  # the test model has the tiny preset's shape
    linear = 2 * split["layer_matrices"]
    out_channels = 2 * (3 * 64 + 2 * 32 + 2 * 128)
    everything = split["embedding"] + 2 * (split["layer_matrices"] + split["layer_norms"]) + split["final_norm"]
    after = linear + 4 * out_channels + 2 * (everything - linear)  # int8 + fp32 scales + fp16 rest
    assert f"{4 * everything:,} bytes -> {after:,} bytes" in proc.stdout
    held_out = str(REPO / "data" / "zh_instruct_eval.jsonl")
    losses = {}
    for name, path in (("tuned", tuned), ("int8", tmp_path / "int8"), ("base", tmp_path / "base")):
        out = run_cli("eval", "--checkpoint", path, "--data", held_out, "--max-seq-len", "64", "--json", check=True)
        losses[name] = json.loads(out.stdout)["loss"]
    assert losses["tuned"] < losses["base"]  # the fine-tune learned something
    assert losses["int8"] != losses["tuned"] and abs(losses["int8"] - losses["tuned"]) < 0.01 * losses["tuned"]


def test_lora_adapters_merge_into_hugging_face_weights(hf_dir, tmp_path, ms):
    """Fine-tune LoRA adapters on converted weights, export merged: transformers' logits of
    the merged model equal ours with the adapters applied."""
    from llama_npu.build import build_network
    from llama_npu.recipe import load_recipe

    src, _ = hf_dir
    base = tmp_path / "ms"
    run_cli("convert", "hf-to-ms", "--src", src, "--dst", base, check=True)
    lora = ["--set", "strategies.lora.enabled=true", "--set", "strategies.lora.alpha=32",
            "--set", "strategies.lora.target_modules=.*wq|.*wv|.*w2", "--set", "train.optimizer.lr=0.05",
            "--set", "train.warmup_steps=0"]
    run_cli("train", SMOKE, "--output-dir", tmp_path / "run", *TINY_RUN, "--set", f"model.checkpoint={base}",
            "--set", "train.max_steps=3", *lora, check=True)
    step = tmp_path / "run" / "checkpoints" / "step_3" / "model.ckpt"
    run_cli("convert", "ms-to-hf", "--src", base, "--weights", step, "--merge-lora", "--dst", tmp_path / "merged",
            check=True)

    recipe = load_recipe(SMOKE, ["data.max_seq_len=16", f"model.checkpoint={base}", "strategies.lora.enabled=true",
                                 "strategies.lora.alpha=32", "strategies.lora.target_modules=.*wq|.*wv|.*w2"])
    net, _ = build_network(recipe, on_ascend=False)
    ms.load_param_into_net(net, ms.load_checkpoint(str(step)))

    tokens = np.random.default_rng(1).integers(0, 128000, (1, 16)).astype(np.int32)
    ours = logits_of(ms, net, tokens)
    merged = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        theirs = merged(torch.from_numpy(tokens.astype(np.int64))).logits.numpy()
        base_logits = transformers.LlamaForCausalLM.from_pretrained(src).eval()(
            torch.from_numpy(tokens.astype(np.int64))).logits.numpy()
    assert np.abs(ours - theirs).max() < 1e-4
    assert np.abs(theirs - base_logits).max() > 1e-3  # the adapters did change the model
