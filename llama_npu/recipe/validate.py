"""Validation: every problem of a recipe listed at once, section by section, then each
strategy's own checks (strategies/), then each objective's (objectives/). A check that builds on a value runs once that value
passed."""
from __future__ import annotations

import codecs
import re

from ..data.chat_template import TEMPLATES
from ..data.formats import FORMATS, ON_BAD_RECORD
from ..data.truncation import MODES as TRUNCATION_MODES
from ..memory.devices import DEVICE_TARGETS
from ..model.architecture import PRESETS, SIZE_KEYS, resolve_shape
from ..model.llama import MAX_POSITIONS
from ..objectives import NAMES, OBJECTIVES
from ..strategies import STRATEGIES
from ..strategies.parallel import check_degrees
from .data_sources import check_sources
from .problems import Problems, RecipeError, choice, positive


def validate(recipe) -> None:
    """Raise RecipeError listing every problem of the recipe."""
    problems = Problems()
    passed = {"model": problems.passes(check_model, recipe.model)}
    problems.check(check_data, recipe.data)
    passed["sizes"] = problems.passes(check_sizes, recipe)
    problems.check(check_train, recipe.train)
    problems.check(check_device, recipe.device)
    problems.check(choice, "train.objective", recipe.train.objective, NAMES)
    for strategy in STRATEGIES:
        ready = all(passed[name] for name in strategy.CHECKED_AFTER)
        passed[strategy.KEY] = ready and problems.passes(strategy.check, recipe)
    problems.check(check_sources, recipe)
    # each checks its section; the picked one what it refuses, dividing the batch by the layout's degrees
    if problems.passes(check_degrees, recipe):
        for objective in OBJECTIVES:
            problems.check(objective.check, recipe)
    problems.raise_any()


def check_model(m) -> None:
    problems = Problems()
    problems.check(choice, "model.preset", m.preset, PRESETS)
    for name in SIZE_KEYS:
        value = getattr(m, name)
        if value is not None:
            problems.check(positive, f"model.{name}", value)
    problems.raise_any()
    shape = resolve_shape(m)
    if shape.hidden_size % shape.num_heads:
        problems.append(f"model.hidden_size={shape.hidden_size} is not divisible by "
                        f"model.num_heads={shape.num_heads}")
    if shape.num_heads % shape.num_kv_heads:
        problems.append(f"model.num_heads={shape.num_heads} is not divisible by "
                        f"model.num_kv_heads={shape.num_kv_heads} (grouped-query attention)")
    problems.raise_any()


def check_data(d) -> None:
    problems = Problems()
    problems.check(choice, "data.format", d.format, FORMATS)
    problems.check(choice, "data.on_bad_record", d.on_bad_record, ON_BAD_RECORD)
    problems.check(choice, "data.template", d.template, TEMPLATES)
    problems.check(choice, "data.truncation", d.truncation, TRUNCATION_MODES)
    if not d.dataset and bool(d.train_files) == bool(d.prepared):
        problems.append("data: expected either data.train_files (raw files), data.dataset (entries of a "
                        "dataset_info.json) or data.prepared (a prepare-data directory), not both or neither")
    if d.encoding:
        try:
            codecs.lookup(d.encoding)
        except LookupError:
            problems.append(f"data.encoding: unknown encoding {d.encoding!r}; expected a name such as gbk, "
                            f"gb18030, big5, utf-16")
    problems += [f"data.columns.{key}: expected a column name, got an empty one"
                 for key, column in d.columns.items() if not column.strip()]
    if d.prepared and d.pack:
        problems.append("data.pack applies to raw data.train_files; a prepared directory is packed "
                        "or not by llama-npu prepare-data --pack")
    problems.raise_any()


def check_sizes(recipe) -> None:
    """The sequence length and the train section's counts, which the batch checks build on."""
    t, problems = recipe.train, Problems()
    if not 0 < recipe.data.max_seq_len <= MAX_POSITIONS:  # the planner and the model's RoPE table stop there
        problems.append(f"data.max_seq_len: expected 1 to {MAX_POSITIONS} (Llama 3.2's context), got "
                        f"{recipe.data.max_seq_len}")
    if t.max_steps is not None:
        problems.check(positive, "train.max_steps", t.max_steps)
    if t.epochs is not None:
        problems.check(positive, "train.epochs", t.epochs)
    problems.check(positive, "train.micro_batch_size", t.micro_batch_size)
    problems.check(positive, "train.global_batch_size", t.global_batch_size, True)
    problems.check(positive, "train.warmup_steps", t.warmup_steps, True)
    if not 0.0 <= t.min_lr_ratio <= 1.0:
        problems.append(f"train.min_lr_ratio: expected a value in [0, 1], got {t.min_lr_ratio}")
    problems.check(positive, "train.grad_clip", t.grad_clip, True)
    problems.check(positive, "train.save_every", t.save_every)
    problems.check(positive, "train.keep_last", t.keep_last)
    problems.check(positive, "train.max_nonfinite_steps", t.max_nonfinite_steps, True)
    problems.check(positive, "train.eval_every", t.eval_every, True)
    problems.raise_any()


def check_train(t) -> None:
    """The execution mode and the optimizer."""
    o, problems = t.optimizer, Problems()
    problems.check(choice, "train.mode", t.mode, ("graph", "pynative"))
    problems.check(choice, "train.optimizer.name", o.name, ("adamw", "sgd"))
    problems.check(positive, "train.optimizer.lr", o.lr)
    problems.check(positive, "train.optimizer.weight_decay", o.weight_decay, True)
    for name in ("beta1", "beta2"):
        value = getattr(o, name)
        if not 0.0 <= value < 1.0:
            problems.append(f"train.optimizer.{name}: expected a value in [0, 1), got {value}")
    problems.check(positive, "train.optimizer.eps", o.eps)
    problems.raise_any()


def check_device(dev) -> None:
    problems = Problems()
    problems.check(choice, "device.name", dev.name, tuple(DEVICE_TARGETS))
    problems.check(choice, "device.target", dev.target, ("cpu", "ascend"))
    if DEVICE_TARGETS.get(dev.name, dev.target) != dev.target:
        problems.append(f"device.name={dev.name} runs on target '{DEVICE_TARGETS[dev.name]}', "
                        f"but device.target={dev.target}")
    if dev.max_device_memory:
        problems.check(check_pool_size, dev.max_device_memory)
    problems.raise_any()


# MindSpore's own pattern for the pool size (mindspore/runtime/memory.py _MEMORY_PATTERN, which
# set_memory matches from the start, then reads float(size[:-2])): a number, then "GB", nothing else.
_POOL_SIZE = re.compile(r"(?:[1-9][0-9]*\.?[0-9]*|0\.[0-9]*)GB", re.ASCII)


def check_pool_size(size: str) -> None:
    """device.max_device_memory in the one form ms.runtime.set_memory accepts (training/runtime.py
    hands it over as written), so that a card's init_runtime cannot refuse what validate passed."""
    if not _POOL_SIZE.fullmatch(size) or float(size[:-2]) == 0:
        # zero: set_memory refuses "0GB"/"0.0GB" and context.set_max_device_memory every zero
        raise RecipeError(f"device.max_device_memory: expected a size above zero in MindSpore's form <number>GB, "
                          f"such as 29GB or 30.5GB, got {size!r}")
