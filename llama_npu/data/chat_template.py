"""The Llama 3 chat format, built from token ids so the role markers can never be
confused with text:

    <|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>
    <|start_header_id|>user<|end_header_id|>\n\n{user}<|eot_id|>
    <|start_header_id|>assistant<|end_header_id|>\n\n{answer}<|eot_id|>

The loss covers each assistant answer and the <|eot_id|> that closes it (so the model
learns to stop), in every turn; headers, system and user turns are masked with IGNORE_ID
unless `train_on_prompt` is set.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from ..model.tokens import BOS_ID, EOT_ID, IGNORE_ID

ROLES = ("system", "user", "assistant")
TEMPLATES = ("llama3",)  # a recipe's data.template: this module's format, LLaMA-Factory's name for it

Message = Tuple[str, str]  # (role, content)


def render_text(messages: Sequence[Message]) -> str:
    """The same conversation as one string (for reading and for token-for-token tests)."""
    parts = ["<|begin_of_text|>"]
    for role, content in messages:
        parts.append(f"<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>")
    return "".join(parts)


def role_headers(tokenizer) -> Dict[str, List[int]]:
    """<|start_header_id|>role<|end_header_id|>\\n\\n as ids, for each role, with the marker
    ids the tokenizer gives (data/tokenizer.py checked them when it loaded)."""
    start, end = tokenizer.token_to_id("<|start_header_id|>"), tokenizer.token_to_id("<|end_header_id|>")
    newlines = tokenizer.encode("\n\n", add_special_tokens=False).ids
    return {role: [start] + tokenizer.encode(role, add_special_tokens=False).ids + [end] + newlines
            for role in ROLES}


def assemble_chat(roles: Sequence[str], contents: Sequence[Sequence[int]], headers: Dict[str, List[int]],
                  train_on_prompt: bool = False) -> Tuple[List[int], List[int]]:
    """Token ids and labels (IGNORE_ID where no loss is taken) from already tokenized turns."""
    ids, labels = [BOS_ID], [IGNORE_ID]
    for role, content in zip(roles, contents):
        if role not in headers:
            raise ValueError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
        body = list(content) + [EOT_ID]
        learn = role == "assistant" or train_on_prompt
        ids += headers[role] + body
        labels += [IGNORE_ID] * len(headers[role]) + (body if learn else [IGNORE_ID] * len(body))
    return ids, labels


def encode_chat(tokenizer, messages: Sequence[Message], train_on_prompt: bool = False
                ) -> Tuple[List[int], List[int]]:
    """One conversation, tokenized and assembled."""
    contents = tokenizer.encode_batch([c for _, c in messages], add_special_tokens=False)
    return assemble_chat([r for r, _ in messages], [c.ids for c in contents], role_headers(tokenizer),
                         train_on_prompt)
