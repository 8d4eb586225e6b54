"""How a ShareGPT turn is read: which of its keys holds the role and which the text, and
which role names mean the user, the assistant and the system. LLaMA-Factory calls these the
tags (its parser.py DatasetAttr: role_tag, content_tag, user_tag, assistant_tag,
observation_tag, function_tag, system_tag) and reads them from a dataset_info.json entry's
`tags`; a recipe gives them as data.tags. A tags object leaves every tag it omits unset, as
LLaMA-Factory's does (a system turn then is no known role).

Without tags each turn's own keys decide: {from, value} or {role, content}, with the role
names both layouts use (human/user, gpt/assistant, system). LLaMA-Factory's defaults (from,
value, human, gpt, observation, function_call, system) are within that. Observation and
function-call turns are function calling, which this harness does not train: their records
are bad records. A leaf.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

from .errors import RecordError

TAG_NAMES = ("role_tag", "content_tag", "user_tag", "assistant_tag", "observation_tag", "function_tag",
             "system_tag")
# What LLaMA-Factory's tags name, in our roles; "tool" (function calling) is refused by the readers.
TAG_ROLES = {"user_tag": "user", "assistant_tag": "assistant", "system_tag": "system", "observation_tag": "tool",
             "function_tag": "tool"}
# Without tags: the role names of both layouts, and function calling's (LLaMA-Factory's default tags).
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system",
         "observation": "tool", "function_call": "tool"}


def tag_problems(tags: Dict[str, str], where: str) -> list:
    """The problems of a tags object (data.tags, or an entry's `tags`), one line each."""
    unknown = [name for name in tags if name not in TAG_NAMES]
    problems = [f"{where}.{name}: unknown tag; expected one of {', '.join(TAG_NAMES)}" for name in unknown]
    if tags and not unknown and not {"role_tag", "content_tag"} <= set(tags):
        problems.append(f"{where}: names {', '.join(tags)} but not role_tag and content_tag; a tags object leaves "
                        f"every tag it omits unset (LLaMA-Factory's rule), and a turn needs both")
    return problems


def turn_keys(turn: dict, tags: Dict[str, str]) -> Tuple[str, str]:
    """(the role's key, the text's key) of a turn."""
    if tags:
        return tags["role_tag"], tags["content_tag"]
    return ("from", "value") if "from" in turn or "value" in turn else ("role", "content")


def role_names(tags: Dict[str, str]) -> Dict[str, str]:
    """The turn's role name -> our role (user, assistant, system, tool)."""
    if not tags:
        return ROLES
    return {tags[tag]: role for tag, role in TAG_ROLES.items() if tags.get(tag)}


def role_of(name: object, tags: Dict[str, str]) -> Optional[str]:
    """Our role of a turn's role name, None if the tags know no such name."""
    return role_names(tags).get(name) if isinstance(name, str) else None


def unknown_role(where: str, name: object, tags: Dict[str, str]) -> RecordError:
    names = ", ".join(name for name, role in role_names(tags).items() if role != "tool")
    by = " (data.tags)" if tags else ""
    return RecordError(f"{where}: unknown role {name!r}; expected one of {names}{by}", "unknown role")
