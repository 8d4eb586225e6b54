"""Recipe schema, YAML loading, `--set` overrides and validation.

Everything here is pure Python so that a bad recipe is refused in well under a second,
before MindSpore (slow to import) is touched.
"""
from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

import yaml

# Leaves only (modules that import nothing from the package), so that every other module may
# import this one and a bad recipe is refused before MindSpore is touched.
from ..common.launcher import launched_workers
from ..data.formats import FORMATS, ON_BAD_RECORD
from ..memory.devices import DEVICE_TARGETS, DeviceError, parse_bytes
from ..model.architecture import LINEAR_LAYERS, PRESETS, SIZE_KEYS, matched_layers, resolve_shape


class RecipeError(ValueError):
    """Recipe problems the user must fix, each a line naming the key and what was expected.
    The message is the first; `validate` prints every one of `problems`."""

    def __init__(self, problem):
        self.problems = list(problem) if isinstance(problem, list) else [str(problem)]
        more = len(self.problems) - 1
        super().__init__(self.problems[0] + (f" (and {more} more: llama-npu validate with the same arguments "
                                             f"lists them all)" if more else ""))


class _Problems(list):
    """Problem lines collected, so that one bad key does not hide the next."""

    def check(self, fn, *args):
        """fn(*args), its RecipeError's problems collected; None then."""
        try:
            return fn(*args)
        except RecipeError as exc:
            self.extend(exc.problems)
        return None

    def raise_any(self) -> None:
        if self:
            raise RecipeError(list(dict.fromkeys(self)))  # each once


@dataclass
class ModelSection:
    preset: str = "tiny"  # llama3.2-1b | llama3.2-3b | tiny
    checkpoint: str = ""  # a `llama-npu convert hf-to-ms` directory to start from (else random init)
    # Optional size overrides on top of the preset (tests shrink shipped recipes with these).
    hidden_size: Optional[int] = None
    num_layers: Optional[int] = None
    num_heads: Optional[int] = None
    num_kv_heads: Optional[int] = None
    intermediate_size: Optional[int] = None


@dataclass
class DataSection:
    format: str = "alpaca"  # alpaca | sharegpt | text (of train_files and eval_files)
    train_files: List[str] = field(default_factory=list)  # raw files, prepared in memory at start
    prepared: str = ""  # or a `llama-npu prepare-data` directory (MindRecord)
    eval_files: List[str] = field(default_factory=list)
    tokenizer: str = "llama3.2"  # or a path to a Hugging Face tokenizer.json
    max_seq_len: int = 64  # positions the model sees; a sample holds up to max_seq_len + 1 tokens
    train_on_prompt: bool = False
    pack: bool = False  # pack raw train_files into full rows (prepared data says it itself)
    on_bad_record: str = "error"  # error: refuse the run, listing them | skip: train on the good records


@dataclass
class OptimizerSection:
    name: str = "adamw"  # adamw | sgd
    lr: float = 3e-4
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8


@dataclass
class TrainSection:
    max_steps: int = 100
    micro_batch_size: int = 4
    # Samples per optimizer step over all data-parallel ranks; 0 means micro_batch_size x data.
    global_batch_size: int = 0
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0  # 0 disables clipping
    seed: int = 0
    save_every: int = 50
    keep_last: int = 2
    # Stop after this many skipped non-finite steps in a row that loss scaling cannot explain
    # (no dynamic scaling, or its scale at the floor); 0 never stops.
    max_nonfinite_steps: int = 10
    eval_every: int = 0  # 0: evaluate only at the end (when eval files are given)
    mode: str = "graph"  # graph | pynative
    optimizer: OptimizerSection = field(default_factory=OptimizerSection)


@dataclass
class PrecisionSection:
    amp_level: str = "O0"  # O0 | O1 | O2 | O3
    dtype: str = "float16"  # compute dtype when amp_level != O0: float16 | bfloat16
    loss_scale: str = "none"  # none | dynamic | static:VALUE
    loss_scale_init: float = 65536.0
    loss_scale_factor: float = 2.0
    loss_scale_window: int = 1000


@dataclass
class RecomputeSection:
    mode: str = "none"  # none | full | selective
    layers: int = 0  # full only: recompute the first N layers; 0 means all


@dataclass
class ChunkedCESection:
    enabled: bool = False
    chunk_size: int = 1024  # tokens per chunk of the LM head + loss


@dataclass
class LoraSection:
    enabled: bool = False
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: str = ".*wq|.*wk|.*wv|.*wo"  # regex over wq wk wv wo w1 w2 w3


@dataclass
class ParallelSection:
    # auto (null): the launched workers / (model x pipeline), resolved when the recipe loads.
    data: Optional[int] = None
    model: int = 1  # tensor (operator) parallel; Ascend only
    pipeline: int = 1  # pipeline stages; Ascend only
    micro_batches: int = 1  # pipeline micro-batches per step
    optimizer_shard: bool = False  # shard optimizer states across data parallel; Ascend only
    sequence_parallel: bool = False  # with model > 1
    vocab_emb_dp: bool = True  # keep the embedding/LM head data-parallel rather than split by model


@dataclass
class StrategiesSection:
    precision: PrecisionSection = field(default_factory=PrecisionSection)
    recompute: RecomputeSection = field(default_factory=RecomputeSection)
    chunked_ce: ChunkedCESection = field(default_factory=ChunkedCESection)
    lora: LoraSection = field(default_factory=LoraSection)
    parallel: ParallelSection = field(default_factory=ParallelSection)


@dataclass
class DeviceSection:
    target: str = "cpu"  # cpu | ascend
    name: str = "cpu"  # cpu | 910a | 910b | 910b4
    max_device_memory: str = ""  # e.g. "29GB"; empty keeps MindSpore's default


@dataclass
class Recipe:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    train: TrainSection = field(default_factory=TrainSection)
    strategies: StrategiesSection = field(default_factory=StrategiesSection)
    device: DeviceSection = field(default_factory=DeviceSection)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def digest(self) -> str:
        text = json.dumps(self.to_dict(), sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def with_absolute_paths(recipe: Recipe) -> Recipe:
    """The recipe with its file paths resolved against the current directory, as a run
    stores it (its recipe.yaml), so that eval, generate, ms-to-hf and resume find the same
    files from any directory. The tokenizer name llama3.2 is a name, not a path."""
    def absolute(path: str) -> str:
        return os.path.abspath(path) if path else path

    d = recipe.data
    return dataclasses.replace(
        recipe, model=dataclasses.replace(recipe.model, checkpoint=absolute(recipe.model.checkpoint)),
        data=dataclasses.replace(d, train_files=[absolute(p) for p in d.train_files], prepared=absolute(d.prepared),
                                 eval_files=[absolute(p) for p in d.eval_files],
                                 tokenizer=d.tokenizer if d.tokenizer == "llama3.2" else absolute(d.tokenizer)))


# ---------------------------------------------------------------- loading and coercion

def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return f"{_type_name(inner[0])} or null"
    if origin in (list, List):
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp, key: str) -> Any:
    """Turn `value` (from YAML or a --set string) into type `tp`, or raise naming `key`."""
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        inner = [a for a in typing.get_args(tp) if a is not type(None)][0]
        # "auto" reads as null: the optional key takes its derived value (the preset's size;
        # for strategies.parallel.data the workers left by model x pipeline).
        if value is None or (isinstance(value, str) and value.lower() in ("null", "none", "", "auto")):
            return None
        return _coerce(value, inner, key)
    if origin in (list, List):
        item_type = typing.get_args(tp)[0]
        if isinstance(value, str):
            value = [v for v in value.split(",") if v] if value else []
        if not isinstance(value, list):
            raise RecipeError(f"{key}: expected {_type_name(tp)}, got {value!r}")
        return [_coerce(v, item_type, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            return value.lower() in ("true", "yes", "on", "1")
        raise RecipeError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise RecipeError(f"{key}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise RecipeError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, bool):
            raise RecipeError(f"{key}: expected a number, got {value!r}")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise RecipeError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, (dict, list)):
            raise RecipeError(f"{key}: expected a string, got {value!r}")
        return str(value)
    raise AssertionError(f"unhandled recipe type {tp} for {key}")


def _unknown_key(key: str, candidates) -> RecipeError:
    name = key.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(name, list(candidates), n=1)
    hint = f" (did you mean '{key.rsplit('.', 1)[0] + '.' if '.' in key else ''}{close[0]}'?)" if close else ""
    return RecipeError(f"unknown key '{key}'{hint}")


def _build(cls, data: Any, prefix: str, problems: _Problems):
    """Build dataclass `cls` from a mapping; an unknown key or a wrong type is a problem,
    and the key keeps its default so the rest can still be checked."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        problems.append(f"{prefix or 'recipe'}: expected a mapping of keys, got {data!r}")
        return cls()
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            problems.append(str(_unknown_key(full, fields)))
            continue
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value, full, problems)
        else:
            coerced = problems.check(_coerce, value, tp, full)
            if coerced is not None or value is None:
                kwargs[key] = coerced
    return cls(**kwargs)


def _apply_override(tree: dict, assignment: str, cls=Recipe) -> None:
    """Apply one `a.b.c=value` to the raw mapping `tree`, checking the key path exists."""
    if "=" not in assignment:
        raise RecipeError(f"--set {assignment!r}: expected KEY=VALUE, e.g. train.max_steps=20")
    key, raw = assignment.split("=", 1)
    parts = key.strip().split(".")
    node, node_cls = tree, cls
    for depth, part in enumerate(parts):
        hints = typing.get_type_hints(node_cls)
        path = ".".join(parts[: depth + 1])
        if part not in hints:
            raise _unknown_key(path, hints)
        tp = hints[part]
        if depth == len(parts) - 1:
            if dataclasses.is_dataclass(tp):
                raise RecipeError(f"--set {key}: '{path}' is a section; set one of its keys")
            # YAML parsing gives 1e-4 -> float, true -> bool, [a, b] -> list; _build coerces.
            try:
                node[part] = yaml.safe_load(raw) if raw.strip() else ""
            except yaml.YAMLError:
                node[part] = raw
        else:
            if not dataclasses.is_dataclass(tp):
                raise RecipeError(f"--set {key}: '{path}' is not a section")
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node, node_cls = node[part], tp


def load_recipe(path: str | Path, overrides: Optional[List[str]] = None,
                workers: Optional[int] = None) -> Recipe:
    """Read, override, coerce and validate a recipe. Relative data paths are left as
    written: they resolve against the current directory (the shipped recipes expect the
    repository root). `workers`: the processes the run will have (validate --workers, plan
    --devices); by default the ones msrun launched, 1 for a plain process."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"recipe file not found: {path}")
    try:
        tree = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise RecipeError(f"{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(tree, dict):
        raise RecipeError(f"{path}: expected a mapping with sections model, data, train, strategies, device")
    return recipe_from_dict(tree, overrides, workers)


def recipe_from_dict(tree: dict, overrides: Optional[List[str]] = None, workers: Optional[int] = None) -> Recipe:
    """Build and validate a recipe from a mapping (changed in place by `overrides`, --set's
    KEY=VALUE assignments); `workers` as for load_recipe."""
    problems = _Problems()
    for assignment in overrides or []:
        problems.check(_apply_override, tree, assignment)
    recipe = _build(Recipe, tree, "", problems)
    # A key refused above keeps its default, so the checks below still see well-typed values.
    problems.check(resolve_data_parallel, recipe, workers)
    if recipe.strategies.parallel.data is None:  # an auto that did not resolve: the rest checked as one process
        recipe.strategies.parallel.data = 1
    problems.check(validate, recipe)
    problems.raise_any()
    return recipe


def resolve_data_parallel(recipe: Recipe, workers: Optional[int]) -> None:
    """strategies.parallel.data=auto -> workers / (model x pipeline). Without a worker count
    (a plain process) auto is 1; the worker check (strategies/parallel.check_workers) then
    says what a layout with model or pipeline > 1 needs."""
    par = recipe.strategies.parallel
    if par.data is not None:
        return
    if workers is None:
        workers = launched_workers()
    for name in ("model", "pipeline"):
        _positive(f"strategies.parallel.{name}", getattr(par, name))
    replica = par.model * par.pipeline
    if workers == 1:
        par.data = 1
    elif workers % replica:
        raise RecipeError(f"strategies.parallel.data=auto: {workers} workers do not divide into model {par.model} "
                          f"x pipeline {par.pipeline} = {replica}; launch a multiple of {replica} workers")
    else:
        par.data = workers // replica


# ---------------------------------------------------------------- validation

def _choice(key: str, value: str, allowed) -> None:
    if value not in allowed:
        raise RecipeError(f"{key}: expected one of {', '.join(allowed)}, got {value!r}")


def _positive(key: str, value, allow_zero=False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise RecipeError(f"{key}: expected a value {bound}, got {value}")


def accumulation_steps(recipe: Recipe) -> int:
    """Micro-batches per optimizer step: global / (micro x data parallel)."""
    t, par = recipe.train, recipe.strategies.parallel
    if t.global_batch_size == 0:
        return 1
    per_step = t.micro_batch_size * par.data
    if par.pipeline > 1:
        # The pipeline's micro-batches are its accumulation.
        if t.global_batch_size != per_step * par.micro_batches:
            raise RecipeError(
                f"train.global_batch_size={t.global_batch_size}: with pipeline stages it must equal "
                f"train.micro_batch_size={t.micro_batch_size} x strategies.parallel.data={par.data} x "
                f"strategies.parallel.micro_batches={par.micro_batches} = {per_step * par.micro_batches}")
        return 1
    if t.global_batch_size % per_step:
        raise RecipeError(
            f"train.global_batch_size={t.global_batch_size} is not divisible by "
            f"train.micro_batch_size={t.micro_batch_size} x data parallel {par.data} = {per_step}")
    return t.global_batch_size // per_step


def validate(recipe: Recipe) -> None:
    """Raise RecipeError listing every problem of the recipe (checks that build on a value
    run once that value passed)."""
    m, d, t, o = recipe.model, recipe.data, recipe.train, recipe.train.optimizer
    p, dev = recipe.strategies.precision, recipe.device
    problems = _Problems()
    check = problems.check
    check(_choice, "model.preset", m.preset, PRESETS)
    for name in SIZE_KEYS:
        value = getattr(m, name)
        if value is not None:
            check(_positive, f"model.{name}", value)
    shape_ok = not problems
    if shape_ok:
        shape = resolve_shape(m)
        if shape.hidden_size % shape.num_heads:
            problems.append(f"model.hidden_size={shape.hidden_size} is not divisible by "
                            f"model.num_heads={shape.num_heads}")
        if shape.num_heads % shape.num_kv_heads:
            problems.append(f"model.num_heads={shape.num_heads} is not divisible by "
                            f"model.num_kv_heads={shape.num_kv_heads} (grouped-query attention)")
        shape_ok = not problems
    check(_choice, "data.format", d.format, FORMATS)
    check(_choice, "data.on_bad_record", d.on_bad_record, ON_BAD_RECORD)
    if bool(d.train_files) == bool(d.prepared):
        problems.append("data: expected either data.train_files (raw files) or data.prepared (a "
                        "prepare-data directory), not both or neither")
    if d.prepared and d.pack:
        problems.append("data.pack applies to raw data.train_files; a prepared directory is packed "
                        "or not by llama-npu prepare-data --pack")
    counted = len(problems)
    check(_positive, "data.max_seq_len", d.max_seq_len)
    check(_positive, "train.max_steps", t.max_steps)
    check(_positive, "train.micro_batch_size", t.micro_batch_size)
    check(_positive, "train.global_batch_size", t.global_batch_size, True)
    check(_positive, "train.warmup_steps", t.warmup_steps, True)
    if not 0.0 <= t.min_lr_ratio <= 1.0:
        problems.append(f"train.min_lr_ratio: expected a value in [0, 1], got {t.min_lr_ratio}")
    check(_positive, "train.grad_clip", t.grad_clip, True)
    check(_positive, "train.save_every", t.save_every)
    check(_positive, "train.keep_last", t.keep_last)
    check(_positive, "train.max_nonfinite_steps", t.max_nonfinite_steps, True)
    check(_positive, "train.eval_every", t.eval_every, True)
    sizes_ok = len(problems) == counted
    check(_choice, "train.mode", t.mode, ("graph", "pynative"))
    check(_choice, "train.optimizer.name", o.name, ("adamw", "sgd"))
    check(_positive, "train.optimizer.lr", o.lr)
    check(_positive, "train.optimizer.weight_decay", o.weight_decay, True)
    for name in ("beta1", "beta2"):
        value = getattr(o, name)
        if not 0.0 <= value < 1.0:
            problems.append(f"train.optimizer.{name}: expected a value in [0, 1), got {value}")
    check(_positive, "train.optimizer.eps", o.eps)

    check(_choice, "device.name", dev.name, tuple(DEVICE_TARGETS))
    check(_choice, "device.target", dev.target, ("cpu", "ascend"))
    if DEVICE_TARGETS.get(dev.name, dev.target) != dev.target:
        problems.append(f"device.name={dev.name} runs on target '{DEVICE_TARGETS[dev.name]}', "
                        f"but device.target={dev.target}")
    if dev.max_device_memory:
        try:
            parse_bytes(dev.max_device_memory)
        except DeviceError as exc:
            problems.append(f"device.max_device_memory: {exc}")

    check(_choice, "strategies.precision.amp_level", p.amp_level, ("O0", "O1", "O2", "O3"))
    check(_choice, "strategies.precision.dtype", p.dtype, ("float16", "bfloat16"))
    if p.amp_level != "O0" and p.dtype == "bfloat16" and dev.name == "910a":
        problems.append("strategies.precision.dtype=bfloat16 with device.name=910a: the Ascend 910A "
                        "has no BF16 kernels; use dtype float16 with loss_scale dynamic")
    if p.amp_level != "O0" and p.dtype == "bfloat16" and dev.target == "cpu":
        problems.append("strategies.precision.dtype=bfloat16 with device.target=cpu: MindSpore's CPU "
                        "backend has no BF16 kernels (Reshape fails); use float16 or amp_level O0 on CPU")
    if p.amp_level == "O3" and o.name == "adamw" and not recipe.strategies.lora.enabled:
        problems.append("strategies.precision.amp_level=O3 with train.optimizer.name=adamw: O3 stores the "
                        "weights and AdamW's moments in half precision, where the update diverges (eps "
                        "underflows); use O2 (fp32 master weights), LoRA (fp32 adapters) or sgd")
    scale = check(parse_loss_scale, p.loss_scale)
    if scale is not None and scale[0] != "none" and (p.amp_level == "O0" or p.dtype == "bfloat16"):
        why = ("amp_level O0 computes in fp32: nothing is in fp16 to scale" if p.amp_level == "O0" else
               "bfloat16 has fp32's exponent range and needs no scaling")
        problems.append(f"strategies.precision.loss_scale={p.loss_scale} with amp_level {p.amp_level} and dtype "
                        f"{p.dtype}: {why}; set loss_scale none")
    check(_positive, "strategies.precision.loss_scale_init", p.loss_scale_init)
    if p.loss_scale_factor <= 1.0:
        problems.append(f"strategies.precision.loss_scale_factor: expected a value > 1, "
                        f"got {p.loss_scale_factor}")
    check(_positive, "strategies.precision.loss_scale_window", p.loss_scale_window)
    if shape_ok:  # both need the model's shape
        check(_validate_memory_strategies, recipe)
        counted = len(problems)
        check(_validate_parallel, recipe)
        if sizes_ok and len(problems) == counted:  # global / (micro x data) needs both valid
            check(accumulation_steps, recipe)
    problems.raise_any()


def _validate_memory_strategies(recipe: Recipe) -> None:
    s = recipe.strategies
    _choice("strategies.recompute.mode", s.recompute.mode, ("none", "full", "selective"))
    num_layers = resolve_shape(recipe.model).num_layers
    if not 0 <= s.recompute.layers <= num_layers:
        raise RecipeError(f"strategies.recompute.layers: expected 0 (all) to {num_layers} "
                          f"(model layers), got {s.recompute.layers}")
    if s.recompute.layers and s.recompute.mode != "full":
        raise RecipeError(f"strategies.recompute.layers={s.recompute.layers} needs "
                          f"strategies.recompute.mode=full, got {s.recompute.mode!r}")
    _positive("strategies.chunked_ce.chunk_size", s.chunked_ce.chunk_size)
    if s.lora.enabled:
        _positive("strategies.lora.rank", s.lora.rank)
        _positive("strategies.lora.alpha", s.lora.alpha)
        if not 0.0 <= s.lora.dropout < 1.0:
            raise RecipeError(f"strategies.lora.dropout: expected a value in [0, 1), got {s.lora.dropout}")
        try:
            matched = matched_layers(s.lora.target_modules)
        except re.error as exc:
            raise RecipeError(f"strategies.lora.target_modules: not a valid regex ({exc})") from None
        if not matched:
            raise RecipeError(f"strategies.lora.target_modules={s.lora.target_modules!r} matches no layer; "
                              f"the linear layers are {', '.join(LINEAR_LAYERS)}")


def _validate_parallel(recipe: Recipe) -> None:
    """Every layout that cannot work is refused here, before anything is built."""
    par, shape, t = recipe.strategies.parallel, resolve_shape(recipe.model), recipe.train
    for name in ("data", "model", "pipeline", "micro_batches"):
        _positive(f"strategies.parallel.{name}", getattr(par, name))
    if shape.num_heads % par.model or shape.num_kv_heads % par.model:
        raise RecipeError(f"strategies.parallel.model={par.model} must divide the attention heads "
                          f"({shape.num_heads}) and KV heads ({shape.num_kv_heads})")
    if shape.intermediate_size % par.model:
        raise RecipeError(f"strategies.parallel.model={par.model} must divide the MLP size "
                          f"({shape.intermediate_size})")
    if shape.vocab_size % par.model:
        raise RecipeError(f"strategies.parallel.model={par.model} must divide the vocabulary ({shape.vocab_size})")
    if par.sequence_parallel and recipe.data.max_seq_len % par.model:
        raise RecipeError(f"strategies.parallel.sequence_parallel splits data.max_seq_len={recipe.data.max_seq_len} "
                          f"across strategies.parallel.model={par.model} ranks; it must divide by {par.model}")
    if shape.num_layers % par.pipeline:
        raise RecipeError(f"strategies.parallel.pipeline={par.pipeline} must divide the layers "
                          f"({shape.num_layers})")
    if par.pipeline > 1 and par.micro_batches < par.pipeline:
        raise RecipeError(f"strategies.parallel.micro_batches={par.micro_batches} must be at least "
                          f"strategies.parallel.pipeline={par.pipeline}, or stages sit idle")
    if par.sequence_parallel and par.model == 1:
        raise RecipeError("strategies.parallel.sequence_parallel needs strategies.parallel.model > 1")
    sharded = [f"{k}={v}" for k, v in (("model", par.model), ("pipeline", par.pipeline)) if v > 1]
    sharded += ["optimizer_shard=true"] if par.optimizer_shard else []
    if sharded and recipe.strategies.chunked_ce.enabled:
        # Sharded layouts compute the loss with MindFormers' sharded CrossEntropyLoss
        # (training/sharded_step.py); our chunked loss has a custom backward whose ops
        # carry no shard strategy.
        raise RecipeError(f"strategies.chunked_ce.enabled=true with strategies.parallel.{sharded[0]}: chunked "
                          f"cross-entropy has no sharded version (its custom backward has no shard strategy); "
                          f"disable one of them")
    if par.optimizer_shard and t.optimizer.name != "adamw":
        # mindspore/nn/optim/optimizer.py _use_parallel_optimizer: only Lamb, AdamWeightDecay
        # and AdaFactor shard their state; any other optimizer raises when it is built.
        raise RecipeError(f"train.optimizer.name={t.optimizer.name} with strategies.parallel.optimizer_shard=true: "
                          f"MindSpore shards only AdamW's state (AdamWeightDecay); use adamw or switch "
                          f"optimizer_shard off")
    if par.pipeline > 1 and (t.eval_every or recipe.data.eval_files):
        key = f"train.eval_every={t.eval_every}" if t.eval_every else "data.eval_files"
        raise RecipeError(f"{key} with strategies.parallel.pipeline={par.pipeline}: evaluation does not run "
                          f"through pipeline stages (MindFormers' PipelineCell acts in training only); merge the "
                          f"checkpoint (llama-npu merge-checkpoints) and run llama-npu eval on it")
    if sharded and recipe.device.target != "ascend":
        raise RecipeError(f"strategies.parallel.{sharded[0]} needs device.target=ascend: operator-sharded "
                          f"(semi_auto_parallel) training is not supported by MindSpore's CPU backend")


def parse_loss_scale(text: str) -> tuple[str, float]:
    """'none' | 'dynamic' | 'static:VALUE' -> (kind, static value or 0)."""
    if text in ("none", "dynamic"):
        return text, 0.0
    if text.startswith("static:"):
        try:
            value = float(text.split(":", 1)[1])
        except ValueError:
            value = -1.0
        if value > 0:
            return "static", value
    raise RecipeError(f"strategies.precision.loss_scale: expected none, dynamic or static:VALUE "
                      f"(VALUE > 0), got {text!r}")
