"""`convert ms-to-hf` writes a Llama 3 chat model: transformers renders the training chat
format from the export's own files and stops generating at <|eot_id|>, as `llama-npu
generate` does."""
import copy
import json

import pytest
import torch  # the test extra's reference implementation: a missing torch is an error, never a skip
import transformers

from conftest import run_cli


SYSTEM, TURN_1, REPLY_1, TURN_2 = "你是一位导游。", "你好，请介绍一下长城。", "长城是中国古代的军事防御工程。", "它有多长？"
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TURN_1},
            {"role": "assistant", "content": REPLY_1}, {"role": "user", "content": TURN_2}]
STOPS = [128001, 128008, 128009]


@pytest.fixture(scope="session")
def plain_export(conversions, tmp_path_factory):
    export = tmp_path_factory.mktemp("chat-export") / "hf"
    run_cli("convert", "ms-to-hf", "--src", conversions["float32"], "--dst", export, check=True)
    return export


def chat_ids(tokenizer, messages):
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return ids if isinstance(ids, list) else ids["input_ids"]


@pytest.mark.parametrize("which", ["converted", "lora run"])
def test_the_export_renders_the_training_chat_format_and_names_its_stop_tokens(plain_export, lora_export, which):
    from llama_npu.data.chat_template import encode_chat, render_text, role_headers
    from llama_npu.data.tokenizer import load_tokenizer

    export = plain_export if which == "converted" else lora_export[1]
    tokenizer = transformers.AutoTokenizer.from_pretrained(export)
    ours = load_tokenizer("llama3.2")
    training_ids, _ = encode_chat(ours, [(m["role"], m["content"]) for m in MESSAGES])
    assert chat_ids(tokenizer, MESSAGES) == training_ids + role_headers(ours)["assistant"]
    text = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=False, tokenize=False)
    assert text == render_text([(m["role"], m["content"]) for m in MESSAGES])
    assert tokenizer.eos_token == "<|eot_id|>"

    generation = json.loads((export / "generation_config.json").read_text())
    config = json.loads((export / "config.json").read_text())
    assert generation["eos_token_id"] == config["eos_token_id"] == STOPS
    assert generation["do_sample"] is False and generation["max_new_tokens"] == 128  # llama-npu generate's defaults
    assert transformers.GenerationConfig.from_pretrained(export).eos_token_id == STOPS


def test_transformers_stops_at_eot_with_llama_npu_generates_reply(hf_dir, tmp_path):
    """The tiny random model is given an <|eot_id|> embedding that wins the argmax after a
    few tokens; transformers, reading only the export's files, then stops there and its reply
    is `llama-npu generate`'s greedy reply on the same weights."""
    from llama_npu.data.tokenizer import default_tokenizer_path, load_tokenizer
    from llama_npu.evaluation.generate import prompt_ids

    src = tmp_path / "hf-eot"
    model = copy.deepcopy(hf_dir[1])
    prompt = torch.tensor([prompt_ids(load_tokenizer("llama3.2"), TURN_1, SYSTEM)])  # what llama-npu generate feeds
    for seed in range(20):  # a direction for <|eot_id|> that the output first points along after >= 2 tokens
        direction = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            model.model.embed_tokens.weight[128009] = 5.0 * direction / direction.norm()
            out = model.generate(prompt, max_new_tokens=12, do_sample=False, eos_token_id=STOPS, pad_token_id=128004)
        reply = out[0, prompt.shape[1]:].tolist()
        if 3 <= len(reply) < 12 and reply[-1] == 128009:
            break
    else:
        pytest.fail("no seed made the tiny model end its reply with <|eot_id|>")
    model.save_pretrained(src, safe_serialization=True)
    (src / "tokenizer.json").write_bytes(default_tokenizer_path().read_bytes())
    run_cli("convert", "hf-to-ms", "--src", src, "--dst", tmp_path / "ms", check=True)
    run_cli("convert", "ms-to-hf", "--src", tmp_path / "ms", "--dst", tmp_path / "export", check=True)

    exported = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "export").eval()
    ids = chat_ids(transformers.AutoTokenizer.from_pretrained(tmp_path / "export"), MESSAGES[:2])
    assert ids == prompt[0].tolist()
    with torch.no_grad():  # no eos_token_id given: generation_config.json's stop tokens
        theirs = exported.generate(torch.tensor([ids]), max_new_tokens=12)[0, len(ids):].tolist()
    assert theirs == reply and theirs[-1] == 128009
    proc = run_cli("generate", "--checkpoint", tmp_path / "ms", "--system", SYSTEM, "--prompt", TURN_1,
                   "--max-new-tokens", 12, check=True)
    assert proc.stdout == load_tokenizer("llama3.2").decode(theirs[:-1]) + "\n"  # the reply, then a newline

