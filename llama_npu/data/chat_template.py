"""The Llama 3 chat format, built from token ids so the role markers can never be
confused with text:

    <|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>
    <|start_header_id|>user<|end_header_id|>\n\n{user}<|eot_id|>
    <|start_header_id|>assistant<|end_header_id|>\n\n{answer}<|eot_id|>

The loss covers each assistant answer and the <|eot_id|> that closes it (so the model
learns to stop); headers, system and user turns are masked with IGNORE_ID unless
`train_on_prompt` is set.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

from ..model import BOS_ID, EOT_ID, IGNORE_ID

START_HEADER_ID = 128006
END_HEADER_ID = 128007
ROLES = ("system", "user", "assistant")

Message = Tuple[str, str]  # (role, content)


def render_text(messages: Sequence[Message]) -> str:
    """The same conversation as one string (for reading and for token-for-token tests)."""
    parts = ["<|begin_of_text|>"]
    for role, content in messages:
        parts.append(f"<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>")
    return "".join(parts)


def encode_chat(tokenizer, messages: Sequence[Message], train_on_prompt: bool = False
                ) -> Tuple[List[int], List[int]]:
    """Token ids and labels (IGNORE_ID where no loss is taken) for one conversation."""
    newlines = tokenizer.encode("\n\n", add_special_tokens=False).ids
    contents = tokenizer.encode_batch([c for _, c in messages], add_special_tokens=False)
    ids, labels = [BOS_ID], [IGNORE_ID]
    for (role, _), encoded in zip(messages, contents):
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
        header = [START_HEADER_ID] + tokenizer.encode(role, add_special_tokens=False).ids \
            + [END_HEADER_ID] + newlines
        body = list(encoded.ids) + [EOT_ID]
        learn = role == "assistant" or train_on_prompt
        ids += header + body
        labels += [IGNORE_ID] * len(header) + (body if learn else [IGNORE_ID] * len(body))
    return ids, labels
