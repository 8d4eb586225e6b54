"""The files beside the weights that make an ms-to-hf export a Llama 3 chat model for
`transformers` and the servers that read the same files: config.json, generation_config.json
and the tokenizer files with a chat template.

- The chat template renders exactly what the harness trains on (data/chat_template.py):
  <|begin_of_text|>, then per turn <|start_header_id|>role<|end_header_id|>\\n\\n, the content
  as given (not trimmed: training does not trim it) and <|eot_id|>; with
  add_generation_prompt, the assistant header.
- The stop tokens are those of Meta's Llama 3.2 Instruct release: <|end_of_text|>,
  <|eom_id|> and <|eot_id|>; without <|eot_id|> among them, generation after a chat
  fine-tune runs on past the end of the reply. The eos_token of the tokenizer is <|eot_id|>,
  as in that release.
- generation_config.json holds `llama-npu generate`'s defaults: greedy, 128 new tokens.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..data.tokenizer import tokenizer_path
from ..model.tokens import BOS_ID, PAD_ID

STOP_TOKEN_IDS = [128001, 128008, 128009]  # <|end_of_text|>, <|eom_id|>, <|eot_id|>
DEFAULT_MAX_NEW_TOKENS = 128  # `llama-npu generate --max-new-tokens`

CHAT_TEMPLATE = (
    "{{- '<|begin_of_text|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

# What transformers' AutoTokenizer reads from an export directory.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def chat_config(config: dict) -> dict:
    """config.json's stop and pad tokens agreeing with generation_config.json."""
    return dict(config, bos_token_id=BOS_ID, eos_token_id=STOP_TOKEN_IDS, pad_token_id=PAD_ID)


def generation_config() -> dict:
    return {"bos_token_id": BOS_ID, "eos_token_id": STOP_TOKEN_IDS, "pad_token_id": PAD_ID,
            "do_sample": False, "max_new_tokens": DEFAULT_MAX_NEW_TOKENS}


def tokenizer_config(shipped: dict | None) -> dict:
    """The tokenizer's own config (or a minimal one for a bare tokenizer.json) with the chat
    template and <|eot_id|> as its end of sequence."""
    config = dict(shipped or {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
                               "pad_token": "<|finetune_right_pad_id|>", "model_max_length": 131072})
    config.update(chat_template=CHAT_TEMPLATE, eos_token="<|eot_id|>")
    return config


def write_model_files(dst: Path, config: dict, tokenizer: str) -> None:
    """config.json, generation_config.json and the tokenizer files of the tokenizer.json
    the run trained with (data.tokenizer), into `dst`."""

    (dst / "config.json").write_text(json.dumps(chat_config(config), indent=2), encoding="utf-8")
    (dst / "generation_config.json").write_text(json.dumps(generation_config(), indent=2), encoding="utf-8")
    directory = tokenizer_path(tokenizer).parent
    shipped = None
    for name in TOKENIZER_FILES:
        if name == "tokenizer_config.json":
            if (directory / name).is_file():
                shipped = json.loads((directory / name).read_text(encoding="utf-8"))
        elif (directory / name).is_file():
            shutil.copyfile(directory / name, dst / name)
    if not (dst / "tokenizer.json").is_file():  # data.tokenizer named a file not called tokenizer.json
        shutil.copyfile(tokenizer_path(tokenizer), dst / "tokenizer.json")
    (dst / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(shipped), indent=2, ensure_ascii=False),
                                               encoding="utf-8")
