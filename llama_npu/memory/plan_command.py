"""`llama-npu plan`: recipe or preset -> Strategy -> estimate (and --fit) -> table or JSON,
and --write-recipe for the recommended plan."""
from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
import yaml

from ..model import MAX_POSITIONS, count_parameters, resolve_shape
from ..recipe import ModelSection, Recipe, RecipeError, load_recipe, recipe_from_dict
from ..strategies.lora import matched_layers
from .devices import get_device
from .planner import Plan, Strategy, estimate, estimate_inference, fit, gb


def strategy_from_recipe(recipe: Recipe, device_name: str) -> Strategy:
    t, s, p = recipe.train, recipe.strategies, recipe.strategies.parallel
    return Strategy(
        seq_len=recipe.data.max_seq_len, micro_batch=t.micro_batch_size,
        global_batch=t.global_batch_size or t.micro_batch_size * p.data,
        amp_level=s.precision.amp_level, dtype=s.precision.dtype, optimizer=t.optimizer.name,
        lora=s.lora.enabled, lora_rank=s.lora.rank, lora_targets=tuple(matched_layers(s.lora.target_modules)),
        recompute=s.recompute.mode, recompute_layers=s.recompute.layers,
        chunked_ce=s.chunked_ce.enabled, chunk_size=s.chunked_ce.chunk_size,
        flash_attention=device_name != "cpu", data=p.data, model=p.model, pipeline=p.pipeline,
        optimizer_shard=p.optimizer_shard, sequence_parallel=p.sequence_parallel, vocab_emb_dp=p.vocab_emb_dp)


def apply_strategy(recipe: Recipe, s: Strategy, device_name: str) -> Recipe:
    """The recipe with the planned settings written in (for --write-recipe)."""
    tree = recipe.to_dict()
    tree["data"]["max_seq_len"] = s.seq_len
    tree["train"].update(micro_batch_size=s.micro_batch, global_batch_size=s.global_batch)
    st = tree["strategies"]
    st["precision"].update(amp_level=s.amp_level, dtype=s.dtype,
                           loss_scale="dynamic" if s.dtype == "float16" and s.amp_level != "O0" else "none")
    st["recompute"].update(mode=s.recompute, layers=s.recompute_layers)
    st["chunked_ce"].update(enabled=s.chunked_ce, chunk_size=s.chunk_size)
    st["lora"]["enabled"] = s.lora
    st["parallel"].update(data=s.data, model=s.model, pipeline=s.pipeline, optimizer_shard=s.optimizer_shard,
                          micro_batches=max(s.accumulation, s.pipeline) if s.pipeline > 1 else 1,
                          sequence_parallel=s.sequence_parallel, vocab_emb_dp=s.vocab_emb_dp)
    tree["device"].update(target="cpu" if device_name == "cpu" else "ascend", name=device_name)
    return recipe_from_dict(tree)


def default_recipe(preset: str, device_name: str) -> Recipe:
    tree = {"model": {"preset": preset}, "data": {"train_files": ["-"], "max_seq_len": 2048},
            "train": {"micro_batch_size": 1},
            "strategies": {"precision": {"amp_level": "O2", "dtype": "float16", "loss_scale": "dynamic"}
                           if device_name in ("910a", "cpu") else {"amp_level": "O2", "dtype": "bfloat16"}},
            "device": {"target": "cpu" if device_name == "cpu" else "ascend", "name": device_name}}
    return recipe_from_dict(tree)


def plan_json(plan: Plan, preset: str) -> dict:
    return {"model": preset, "params": plan.params, "device": plan.device.name, "devices": plan.strategy.devices,
            "device_bytes": plan.device.usable_bytes, "components": dict(plan.components),
            "total_bytes": plan.total_bytes, "fits": plan.fits, "strategy": asdict(plan.strategy)}


def format_plan(plan: Plan, preset: str, title: str = "") -> str:
    s, d = plan.strategy, plan.device
    lines = [f"{title}{preset} ({plan.params:,} parameters) on {d.name} x {s.devices} "
             f"({d.note}; usable {gb(d.usable_bytes)} GB per device)",
             f"  {'full fine-tune' if not s.lora else f'LoRA rank {s.lora_rank}'}, {s.optimizer}, {s.amp_level} "
             f"{s.dtype if s.amp_level != 'O0' else 'float32'}, seq {s.seq_len}, micro-batch {s.micro_batch} x "
             f"{s.accumulation} accumulated x data {s.data} = global {s.global_batch}, recompute {s.recompute}, "
             f"chunked CE {'on' if s.chunked_ce else 'off'}, layout data {s.data} x model {s.model} x "
             f"pipeline {s.pipeline}{', optimizer sharded' if s.optimizer_shard else ''}",
             f"  {'component':<24}{'bytes':>18}{'GB':>10}"]
    for name, value in plan.components.items():
        lines.append(f"  {name:<24}{value:>18,}{gb(value):>10}")
    lines.append(f"  {'total':<24}{plan.total_bytes:>18,}{gb(plan.total_bytes):>10}")
    gap = plan.total_bytes - d.usable_bytes
    lines.append(f"  fits: yes, {gb(-gap)} GB to spare beyond the 10% margin" if plan.fits else
                 f"  fits: no, {gb(gap)} GB over the {gb(d.usable_bytes)} GB usable")
    return "\n".join(lines)


def cached_parameter_count(shape) -> int:
    """The real model's parameter count (model.count_parameters builds it without weights,
    which needs MindSpore: ~3 s), remembered per shape and MindFormers version in the user's
    cache directory so later plans answer in well under 2 s."""
    import hashlib
    import os
    from importlib import metadata

    key = hashlib.sha256(repr((shape, metadata.version("mindformers"))).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "llama-npu" / "param_counts.json"
    try:
        counts = json.loads(cache.read_text())
    except (OSError, ValueError):
        counts = {}
    if key not in counts:
        import tempfile

        from ..runtime import mute_mindformers_info, quiet_frameworks

        quiet_frameworks(Path(tempfile.gettempdir()) / "llama-npu-logs" / "plan")
        mute_mindformers_info()
        counts[key] = count_parameters(shape)
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(counts))
            os.replace(tmp, cache)
        except OSError:
            pass  # a read-only home only costs the next plan the rebuild
    return counts[key]


def format_inference(plan: Plan, preset: str, precision: str) -> str:
    s, d = plan.strategy, plan.device
    lines = [f"{preset} ({plan.params:,} parameters) inference in {precision} on {d.name} "
             f"(usable {gb(d.usable_bytes)} GB): batch {s.micro_batch} x {s.seq_len} tokens",
             f"  {'component':<24}{'bytes':>18}{'GB':>10}"]
    for name, value in plan.components.items():
        if value:
            lines.append(f"  {name:<24}{value:>18,}{gb(value):>10}")
    lines.append(f"  {'total':<24}{plan.total_bytes:>18,}{gb(plan.total_bytes):>10}")
    lines.append(f"  fits: {'yes' if plan.fits else 'no'}")
    return "\n".join(lines)


def run_plan(args) -> tuple[str, int]:
    """(output, exit code) for the parsed `plan` arguments."""
    if bool(args.model) == bool(args.recipe):
        raise RecipeError("plan: give either --model llama3.2-1b|llama3.2-3b or a RECIPE file")
    device = get_device(args.device, args.device_memory or "")
    if args.model:
        if args.model not in ("llama3.2-1b", "llama3.2-3b"):
            raise RecipeError(f"--model: expected llama3.2-1b or llama3.2-3b, got {args.model!r}")
        recipe, preset = default_recipe(args.model, args.device), args.model
    else:
        recipe = load_recipe(args.recipe, args.set)
        preset = recipe.model.preset
    base = strategy_from_recipe(recipe, args.device)
    if args.seq_len:
        if not 0 < args.seq_len <= MAX_POSITIONS:
            raise RecipeError(f"--seq-len: expected 1 to {MAX_POSITIONS} (Llama 3.2's context), got {args.seq_len}")
        base = replace(base, seq_len=args.seq_len)
    if args.micro_batch:
        base = replace(base, micro_batch=args.micro_batch,
                       global_batch=max(base.global_batch, args.micro_batch * base.data))
    if args.model:  # the default global batch: one micro-batch per device
        base = replace(base, global_batch=base.micro_batch * args.devices)
    if args.devices != base.devices and not args.fit:
        raise RecipeError(f"--devices {args.devices}: the layout is data {base.data} x model {base.model} x pipeline "
                          f"{base.pipeline} = {base.devices}; set strategies.parallel or use --fit")
    shape = resolve_shape(ModelSection(preset=preset) if args.model else recipe.model)
    params = cached_parameter_count(shape)
    if args.task == "inference":
        plan = estimate_inference(shape, params, device, args.precision, args.micro_batch or 1,
                                  args.seq_len or base.seq_len)
        result = dict(plan_json(plan, preset), task="inference", precision=args.precision)
        return (json.dumps(result) if args.json else format_inference(plan, preset, args.precision)), 0
    plan = estimate(shape, params, device, base) if base.devices == args.devices else None
    result = plan_json(plan, preset) if plan else {"model": preset, "params": params, "device": device.name,
                                                   "devices": args.devices, "device_bytes": device.usable_bytes}
    text = [format_plan(plan, preset)] if plan else []
    code = 0
    if args.fit:
        best, closest = fit(shape, params, device, base, args.devices, allow_lora=not args.no_lora)
        if best is None:
            gap = closest.total_bytes - device.usable_bytes
            text.append(f"nothing fits on {args.devices} x {device.name}; the closest plan needs {gb(gap)} GB more "
                        f"per device:\n" + format_plan(closest, preset, "closest: "))
            result["recommended"] = None
            code = 1
        else:
            text.append(format_plan(best, preset, "recommended: "))
            result["recommended"] = plan_json(best, preset)
            if args.write_recipe:
                written = apply_strategy(recipe, best.strategy, device.name)
                Path(args.write_recipe).write_text(
                    f"# Written by llama-npu plan --fit for {args.devices} x {device.name}\n"
                    + yaml.safe_dump(written.to_dict(), sort_keys=False, allow_unicode=True), encoding="utf-8")
                text.append(f"wrote {args.write_recipe}")
    return (json.dumps(result) if args.json else "\n".join(text)), code
