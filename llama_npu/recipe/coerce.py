"""A recipe value as its key's type: from YAML, or from a --set string."""
from __future__ import annotations

import math
import typing
from typing import Any, Dict, List

from .problems import RecipeError


def type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return f"{type_name(inner[0])} or null"
    if origin in (list, List):
        return f"list of {type_name(typing.get_args(tp)[0])}"
    if origin in (dict, Dict):
        return f"mapping of {' to '.join(type_name(a) for a in typing.get_args(tp))}"
    return getattr(tp, "__name__", str(tp))


def coerce(value: Any, tp, key: str) -> Any:
    """Turn `value` (from YAML or a --set string) into type `tp`, or raise naming `key`."""
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        inner = [a for a in typing.get_args(tp) if a is not type(None)][0]
        # "auto" reads as null: the optional key takes its derived value (the preset's size;
        # for strategies.parallel.data the workers left by model x pipeline).
        if value is None or (isinstance(value, str) and value.lower() in ("null", "none", "", "auto")):
            return None
        return coerce(value, inner, key)
    if value is None:  # `key:` written with nothing after the colon
        raise RecipeError(f"{key}: no value; expected {type_name(tp)} (or leave the key out for its default)")
    if origin in (list, List):
        item_type = typing.get_args(tp)[0]
        if isinstance(value, str):
            value = [v for v in value.split(",") if v] if value else []
        if not isinstance(value, list):
            raise RecipeError(f"{key}: expected {type_name(tp)}, got {value!r}")
        return [coerce(v, item_type, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin in (dict, Dict):  # from YAML, or --set KEY='{a: b}'
        key_type, value_type = typing.get_args(tp)
        if not isinstance(value, dict):
            raise RecipeError(f"{key}: expected a {type_name(tp)}, e.g. {{instruction: 指令}}, got {value!r}")
        return {coerce(k, key_type, key): coerce(v, value_type, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            return value.lower() in ("true", "yes", "on", "1")
        raise RecipeError(f"{key}: expected true or false, got {value!r}")
    if tp in (int, float):
        return _number(value, tp, key)
    if tp is str:
        if isinstance(value, (dict, list)):
            raise RecipeError(f"{key}: expected a string, got {value!r}")
        return str(value)
    raise AssertionError(f"unhandled recipe type {tp} for {key}")



def _number(value: Any, tp, key: str):
    """An int or float key's value, from a number (a whole one for int) or its text; true and
    false are no numbers."""
    if isinstance(value, str):
        try:
            value = tp(value)
        except ValueError:
            pass
    # NaN and infinity would pass every range check (NaN compares false) and train on nonsense.
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and \
            (tp is float or isinstance(value, int) or value.is_integer()):
        return tp(value)
    raise RecipeError(f"{key}: expected {'an integer' if tp is int else 'a finite number'}, got {value!r}")
