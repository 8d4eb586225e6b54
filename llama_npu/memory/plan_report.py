"""What `llama-npu plan` reports (commands/plan.py parses its arguments): recipe or preset ->
Strategy -> estimate (and --fit) -> table or JSON, and --write-recipe for the recommended plan.

A recipe is planned on its own device (device.name, device.max_device_memory) and layout
(strategies.parallel); --device, --device-memory and --devices override them. Exit 0 when
the plan (with --fit: some plan) fits, 1 when none does, so scripts can branch on it.
"""
from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import List, Optional

import yaml

from ..common.atomic import check_writable, replace_file
from ..data.readers import detect_format
from ..model.architecture import resolve_shape
from .written_recipe import ready_to_train
from ..model.llama import MAX_POSITIONS
from ..recipe.base_weights import CHECKPOINT_PLACEHOLDER
from ..recipe.load import load_recipe, recipe_from_dict
from ..recipe.problems import RecipeError
from ..recipe.schema import Recipe
from ..strategies import offload, parallel, precision
from .devices import DEVICE_TARGETS, GB, MAX_DEVICES, get_device, parse_bytes
from .parameter_count import cached_parameter_count
from .fit_choice import change_list, never_run_on_card, never_run_on_npu, recommend
from .planner import (Plan, Strategy, estimate, estimate_inference, fit_inference, gb, scales_out_of_place,
                      strategy_from_recipe)
from .step_time import DEFAULT_MFU, Rates, format_step_time, step_time

MODELS = ("llama3.2-1b", "llama3.2-3b")
NEVER_RUN_NOTE = ("never run on an NPU: {parts} (semi_auto_parallel: no NPU in CI and the CPU backend "
                  "cannot run it); try a short run first")
NEVER_RUN_ON_CARD_NOTE = ("never run on a card: {parts} (no card in CI; proven instead on the CPU: a host step from "
                          "the in-graph step's state lands within fp32 rounding of it, the card's weights its masters "
                          "cast exactly); run `llama-npu selftest` (host_optimizer) on the card first")


def apply_strategy(recipe: Recipe, s: Strategy) -> Recipe:
    """The recipe with the planned settings written in (for --write-recipe)."""
    tree = recipe.to_dict()
    tree["data"]["max_seq_len"] = s.seq_len
    tree["train"].update(micro_batch_size=s.micro_batch, global_batch_size=s.global_batch)
    st = tree["strategies"]
    st["precision"].update(amp_level=s.amp_level, dtype=s.dtype,
                           loss_scale="dynamic" if s.dtype == "float16" and s.amp_level != "O0" else "none")
    st["recompute"].update(mode=s.recompute, layers=s.recompute_layers)
    st["chunked_ce"].update(enabled=s.chunked_ce, chunk_size=s.chunk_size)
    st["lora"].update(enabled=s.lora, base_dtype=s.lora_base_dtype)
    st["offload"]["optimizer"] = "host" if s.offload else "device"
    if s.lora and not tree["model"]["checkpoint"] and not tree["model"]["random_init"]:  # refused until filled in
        tree["model"]["checkpoint"] = CHECKPOINT_PLACEHOLDER
    st["parallel"].update(data=s.data, model=s.model, pipeline=s.pipeline, optimizer_shard=s.optimizer_shard,
                          micro_batches=max(s.accumulation, s.pipeline) if s.pipeline > 1 else 1,
                          sequence_parallel=s.sequence_parallel, vocab_emb_dp=s.vocab_emb_dp)
    return recipe_from_dict(tree)


def default_recipe(preset: str, device_name: str, devices: int, overrides: List[str]) -> Recipe:
    """What --model plans: the preset at 2048 tokens, micro-batch 1, O2 in the device's half
    precision, data parallel over the devices, then the user's --set. Its data file "-" is a
    placeholder --write-recipe refuses."""
    tree = {"model": {"preset": preset}, "data": {"train_files": ["-"], "max_seq_len": 2048},
            "train": {"micro_batch_size": 1},
            "strategies": {"precision": {"amp_level": "O2", "dtype": "float16", "loss_scale": "dynamic"}
                           if device_name in ("910a", "cpu") else {"amp_level": "O2", "dtype": "bfloat16"},
                           "parallel": {"data": devices}},
            "device": {"target": DEVICE_TARGETS[device_name], "name": device_name}}
    return recipe_from_dict(tree, overrides)


def plan_notes(plan: Plan) -> List[str]:
    """What a reader of the numbers must know about how they were counted."""
    notes = []
    if plan.components.get("micro_batch_gradients"):
        notes.append("micro_batch_gradients: counted at the worst case, a whole micro-batch's gradients alive "
                     "beside the accumulators before they are added in (MindSpore's execution order does not "
                     "guarantee adding each gradient as the backward produces it)")
    if scales_out_of_place(plan.device) and not parallel.is_sharded(plan.strategy) \
            and not offload.planned_on_host(plan.strategy):
        notes.append("update_copies: counted at the worst case, a whole new set of gradients, since on "
                     f"{plan.device.name} the train step compiles for GE (jit level O2), which has no in-place "
                     "multiply, and the graph's order need not free each gradient as its scaled copy is made")
    if plan.outside_pool_bytes:
        notes.append(f"communication_buffers: HCCL's, outside the {gb(plan.device.usable_bytes)} GiB pool, in the "
                     f"{gb(plan.device.hbm_bytes - plan.device.usable_bytes)} GiB of HBM it leaves")
    return notes


def host_figures(plan: Plan, bandwidth: float) -> Optional[dict]:
    """strategies.offload's host side: the bytes a rank and a node hold, the update's time at
    `bandwidth` (10^9 bytes/s a rank) and the traffic a step between a card and its host."""
    if not plan.host:
        return None
    s, rank = plan.strategy, sum(plan.host.values())
    moved = offload.transfer_bytes(plan.params, s, precision.activation_bytes(s))
    return {"components": dict(plan.host), "rank_bytes": rank, "ranks_per_node": offload.ranks_per_node(s),
            "node_bytes": rank * offload.ranks_per_node(s), "host_bandwidth_gbs": bandwidth,
            "update_seconds": offload.update_seconds(plan.params, s, bandwidth), "transfer_bytes": moved,
            "pcie_bandwidth_gbs": offload.PCIE_BANDWIDTH,
            "transfer_seconds": {way: n / (offload.PCIE_BANDWIDTH * 1e9) for way, n in moved.items()}}


def format_host(host: dict, s: Strategy) -> List[str]:
    parts = ", ".join(f"{name} {gb(value)}" for name, value in host["components"].items() if value)
    ranks = host["ranks_per_node"]
    moved, seconds = host["transfer_bytes"], host["transfer_seconds"]
    micro_batches = f"{s.accumulation} micro-batches'" if s.accumulation > 1 else "1 micro-batch's"
    return [f"  host (optimizer on the host): {gb(host['rank_bytes'])} GiB a rank ({parts}), "
            f"{gb(host['node_bytes'])} GiB a node of {ranks} rank{'s' if ranks > 1 else ''}",
            f"  host update: {host['update_seconds']:.2f} s a step at {host['host_bandwidth_gbs']:g} GB/s of host "
            f"memory bandwidth a rank (--host-bandwidth), {offload.UPDATE_BYTES_PER_PARAMETER} bytes a parameter",
            f"  host traffic a step: {gb(moved['to_host'])} GiB to the host ({micro_batches} gradients), "
            f"{gb(moved['to_device'])} GiB of weights back; "
            f"{seconds['to_host']:.2f} s and {seconds['to_device']:.2f} s at {host['pcie_bandwidth_gbs']:g} GB/s "
            f"(PCIe 4.0 x16)"]


def plan_json(plan: Plan, preset: str, rates: Rates = Rates()) -> dict:
    return {"model": preset, "params": plan.params, "device": plan.device.name, "devices": plan.strategy.devices,
            "device_bytes": plan.device.usable_bytes, "hbm_bytes": plan.device.hbm_bytes,
            "components": dict(plan.components), "outside_pool_bytes": plan.outside_pool_bytes,
            "phases": dict(plan.phases), "peak_phase": plan.peak_phase,
            "total_bytes": plan.total_bytes, "fits": plan.fits, "strategy": asdict(plan.strategy),
            "notes": plan_notes(plan), "never_run_on_npu": never_run_on_npu(plan.strategy),
            "never_run_on_card": never_run_on_card(plan.strategy),
            "host": host_figures(plan, rates.host_bandwidth),
            "step_time": step_time(plan, rates) if plan.shape else None}


def finetune_kind(s: Strategy) -> str:
    if not s.lora:
        return "full fine-tune" + (" with the optimizer on the host" if offload.planned_on_host(s) else "")
    return f"LoRA rank {s.lora_rank}" + (" over an int8 base" if s.lora_base_dtype == "int8" else "")


def format_plan(plan: Plan, preset: str, title: str = "", rates: Rates = Rates()) -> str:
    s, d = plan.strategy, plan.device
    lines = [f"{title}{preset} ({plan.params:,} parameters) on {d.name} x {s.devices} "
             f"({d.note}; usable {gb(d.usable_bytes)} GiB per device)",
             f"  {finetune_kind(s)}, {s.optimizer}, {s.amp_level} "
             f"{s.dtype if s.amp_level != 'O0' else 'float32'}, seq {s.seq_len}, micro-batch {s.micro_batch} x "
             f"{s.accumulation} accumulated x data {s.data} = global {s.global_batch}, recompute {s.recompute}, "
             f"chunked CE {'on' if s.chunked_ce else 'off'}, layout data {s.data} x model {s.model} x "
             f"pipeline {s.pipeline}{', optimizer sharded' if s.optimizer_shard else ''}",
             f"  {'component':<24}{'bytes':>18}{'GiB':>10}"]
    for name, value in plan.components.items():
        lines.append(f"  {name:<24}{value:>18,}{gb(value):>10}")
    # Not every component is alive at once: the total is the largest phase plus the margin.
    lines.append("  alive at each phase's peak: " + ", ".join(
        f"{name} {gb(value)} GiB" for name, value in plan.phases.items()) + f" (peak: {plan.peak_phase})")
    lines.append(f"  {'total (peak + margin)':<24}{plan.total_bytes:>18,}{gb(plan.total_bytes):>10}")
    gap = plan.total_bytes - d.usable_bytes
    lines += [f"  note: {note}" for note in plan_notes(plan)]
    if plan.host:
        lines += format_host(host_figures(plan, rates.host_bandwidth), s)
    lines += format_step_time(step_time(plan, rates))
    if plan.fits:
        lines.append(f"  fits: yes, {gb(-gap)} GiB to spare beyond the 10% margin")
    elif gap > 0:
        lines.append(f"  fits: no, {gb(gap)} GiB over the {gb(d.usable_bytes)} GiB usable")
    else:
        lines.append(f"  fits: no, the communication buffers need {gb(plan.outside_pool_bytes)} GiB outside the "
                     f"pool, where {gb(d.hbm_bytes - d.usable_bytes)} GiB are left")
    if never_run_on_npu(s):
        lines.append("  " + NEVER_RUN_NOTE.format(parts=", ".join(never_run_on_npu(s))))
    if never_run_on_card(s):
        lines.append("  " + NEVER_RUN_ON_CARD_NOTE.format(parts=", ".join(never_run_on_card(s))))
    return "\n".join(lines)


def format_inference(plan: Plan, preset: str, precision: str) -> str:
    s, d = plan.strategy, plan.device
    lines = [f"{preset} ({plan.params:,} parameters) inference in {precision} on {d.name} "
             f"(usable {gb(d.usable_bytes)} GiB): batch {s.micro_batch} x {s.seq_len} tokens",
             f"  {'component':<24}{'bytes':>18}{'GiB':>10}"]
    for name, value in plan.components.items():
        if value:
            lines.append(f"  {name:<24}{value:>18,}{gb(value):>10}")
    lines.append(f"  {'total':<24}{plan.total_bytes:>18,}{gb(plan.total_bytes):>10}")
    lines.append(f"  fits: {'yes' if plan.fits else 'no'}")
    return "\n".join(lines)


def check_arguments(args) -> None:
    """Refuse what the plan would otherwise ignore, before any work."""
    if bool(args.model) == bool(args.recipe):
        raise RecipeError("plan: give either --model llama3.2-1b|llama3.2-3b or a RECIPE file")
    if args.model and args.model not in MODELS:
        raise RecipeError(f"--model: expected llama3.2-1b or llama3.2-3b, got {args.model!r}")
    if args.model and not args.device:
        raise RecipeError(f"--model needs --device ({', '.join(DEVICE_TARGETS)}); a recipe names its own device.name")
    if args.devices is not None and not 1 <= args.devices <= MAX_DEVICES:
        raise RecipeError(f"--devices: expected a count from 1 to {MAX_DEVICES:,}, got {args.devices}")
    if args.seq_len is not None and not 0 < args.seq_len <= MAX_POSITIONS:
        raise RecipeError(f"--seq-len: expected 1 to {MAX_POSITIONS} (Llama 3.2's context), got {args.seq_len}")
    if not args.host_bandwidth > 0:
        raise RecipeError(f"--host-bandwidth: expected GB/s > 0, got {args.host_bandwidth:g}")
    if args.mfu is not None and not 0 < args.mfu <= 1:
        raise RecipeError(f"--mfu: expected a fraction of the peak above 0 and at most 1, got {args.mfu:g}")
    if args.peak_tflops is not None and not args.peak_tflops > 0:
        raise RecipeError(f"--peak-tflops: expected TFLOPS > 0, got {args.peak_tflops:g}")
    if args.micro_batch is not None and args.micro_batch < 1:
        raise RecipeError(f"--micro-batch: expected a value > 0, got {args.micro_batch}")
    inference_only = [("--precision", args.precision)]
    step_time_only = [("--mfu", args.mfu is not None), ("--peak-tflops", args.peak_tflops)]
    training_only = [("--no-lora", args.no_lora), ("--no-offload", args.no_offload),
                     ("--write-recipe", args.write_recipe), ("--maximize", args.maximize)]
    fit_only = training_only
    write_only = [("--data", args.data), ("--eval-data", args.eval_data), ("--overwrite", args.overwrite)]
    for flags, needed, what in ((inference_only, args.task == "inference", "--task inference"),
                                (step_time_only, args.task == "train", "--task train"),
                                (training_only, args.task == "train", "--task train"),
                                (fit_only, args.fit, "--fit"), (write_only, args.write_recipe, "--write-recipe")):
        given = [flag for flag, value in flags if value]
        if given and not needed:
            raise RecipeError(f"{given[0]}: only with {what}")
    if args.write_recipe and Path(args.write_recipe).exists() and not args.overwrite:
        raise RecipeError(f"--write-recipe {args.write_recipe}: the file exists; pass --overwrite to replace it")
    if args.write_recipe:
        check_writable(Path(args.write_recipe), "--write-recipe")
    for flag, paths in (("--data", args.data), ("--eval-data", args.eval_data)):
        for path in paths or []:
            if not Path(path).is_file():
                raise RecipeError(f"{flag} {path}: file not found")


def data_format(paths: List[str]) -> str:
    """The one format of --data and --eval-data, detected as eval detects it (the keys of
    each file's first record)."""
    formats = {path: detect_format(Path(path)) for path in paths}
    if len(set(formats.values())) > 1:
        raise RecipeError("--data/--eval-data: the files are in different formats ("
                          + ", ".join(f"{path}: {fmt}" for path, fmt in formats.items())
                          + "); a recipe reads all of them as one data.format")
    return next(iter(formats.values()))


def load_at_devices(args) -> tuple[Recipe, str]:
    """(the recipe at --devices, ""); with --fit, a recipe whose layout --devices breaks (a
    global batch that micro-batch x data does not divide) loads as written, and (recipe, why
    --devices broke it) lets the search repair it."""
    try:
        return load_recipe(args.recipe, args.set, workers=args.devices), ""  # parallel.data=auto resolves to it
    except RecipeError as exc:
        if not (args.fit and args.devices):
            raise
        return load_recipe(args.recipe, args.set), str(exc)


def plan_recipe(args) -> tuple[Recipe, str]:
    """(the recipe to plan, why --devices broke its layout or ""): the file or --model's
    default, with --set, then --device, --device-memory and --data written into it (so the
    written recipe carries them)."""
    broken = ""
    if args.model:
        recipe = default_recipe(args.model, args.device, args.devices or 1, args.set)
    else:
        recipe, broken = load_at_devices(args)
    tree, changed = recipe.to_dict(), False
    if args.device and args.device != recipe.device.name:
        # another device: the recipe's max_device_memory was chosen for its own
        tree["device"].update(name=args.device, target=DEVICE_TARGETS[args.device], max_device_memory="")
        changed = True
    if args.device_memory:
        tree["device"]["max_device_memory"] = f"{parse_bytes(args.device_memory) / GB:g}GB"  # MindSpore's "xxGB"
        changed = True
    if args.data:
        tree["data"].update(train_files=list(args.data), prepared="",
                            format=data_format(list(args.data) + list(args.eval_data or [])))
        changed = True
    if args.eval_data:
        if not args.data:
            given = [path for path in recipe.data.train_files if path != "-"]  # "-": --model's placeholder
            tree["data"]["format"] = data_format(list(args.eval_data) + given)
        tree["data"]["eval_files"] = list(args.eval_data)
        changed = True
    if changed:
        recipe = recipe_from_dict(tree)
    if args.write_recipe and "-" in recipe.data.train_files:
        raise RecipeError("--write-recipe: the planned recipe names no training file (\"-\"); give --data "
                          "FILE... for the written recipe to train on")
    if args.write_recipe and recipe.data.prepared and args.seq_len and args.seq_len != recipe.data.max_seq_len:
        raise RecipeError(f"--seq-len {args.seq_len}: data.prepared={recipe.data.prepared} holds rows for "
                          f"max_seq_len {recipe.data.max_seq_len}; give --data FILE... or prepare it again")
    return recipe, broken


def planned_strategy(recipe: Recipe, args, device_name: str) -> Strategy:
    base = strategy_from_recipe(recipe, device_name)
    devices = args.devices or base.devices
    micro = args.micro_batch or base.micro_batch
    if recipe.train.global_batch_size:
        global_batch = max(base.global_batch, micro * base.data)
    else:  # the recipe's "micro-batch x data": one micro-batch per replica of the planned devices
        global_batch = micro * max(devices // (base.model * base.pipeline), 1)
    return replace(base, seq_len=args.seq_len or base.seq_len, micro_batch=micro, global_batch=global_batch)


def changes(base: Strategy, best: Strategy) -> str:
    changed = change_list(base, best)
    if not changed:
        return "the recipe's settings are the recommended ones"
    return f"changed from the recipe: {', '.join(changed)}"


def write_recipe(recipe: Recipe, best: Plan, out: Path) -> List[str]:
    """Write the recommended recipe, ready to train (memory/written_recipe.py); what that changed."""
    s, d = best.strategy, best.device
    recipe, changed = ready_to_train(apply_strategy(recipe, s))
    header = [f"# Written by llama-npu plan --fit for {s.devices} x {d.name}: {gb(best.total_bytes)} GiB of "
              f"{gb(d.usable_bytes)} GiB usable per device."]
    if never_run_on_npu(s):
        header.append("# Layout " + NEVER_RUN_NOTE.format(parts=", ".join(never_run_on_npu(s))) + ".")
    text = "\n".join(header) + "\n" + yaml.safe_dump(recipe.to_dict(), sort_keys=False, allow_unicode=True)
    replace_file(out, lambda tmp: tmp.write_text(text, encoding="utf-8"))  # --overwrite never leaves half a file
    return changed


def offload_cost(plan: Plan, bandwidth: float) -> str:
    """What moving the optimizer to the host costs, in one line."""
    host = host_figures(plan, bandwidth)
    moved = host["transfer_seconds"]
    return (f"offload costs time: the host update takes about {host['update_seconds']:.1f} s a step at "
            f"{bandwidth:g} GB/s (--host-bandwidth), and the transfers {moved['to_host'] + moved['to_device']:.1f} s "
            f"at PCIe 4.0 (nothing overlaps them today); the host needs {gb(host['node_bytes'])} GiB free "
            f"(strategies.offload.optimizer: host)")


UNCHANGED = ("the plan as given fits: kept unchanged (--fit --maximize micro-batch|seq-len|speed searches for a "
             "better one)")


def as_given(plan: Optional[Plan], base: Strategy, devices: int, broken: str) -> str:
    """The recipe as given, in one line."""
    if broken:
        return f"as given: on {devices} devices, {broken}"
    if plan:
        d = plan.device
        return (f"as given: {gb(plan.total_bytes)} GiB per device of {gb(d.usable_bytes)} GiB usable, "
                f"{'fits' if plan.fits else 'does not fit'}")
    return (f"as given: layout data {base.data} x model {base.model} x pipeline {base.pipeline} = "
            f"{base.devices} device{'s' if base.devices > 1 else ''}, not {devices}")


def plan_inference(args, recipe: Recipe, device, shape) -> tuple[str, int]:
    """`plan --task inference`: the precision asked for, and with --fit the most precise
    weights that fit (that precision, the device's half precision, then int8)."""
    precision = args.precision or "fp16"
    if precision == "bf16" and not device.bf16:
        raise RecipeError(f"--precision bf16: {device.name} has no BF16 kernels ({device.note}); use fp16")
    params, batch = cached_parameter_count(shape), args.micro_batch or 1
    seq_len = args.seq_len or recipe.data.max_seq_len
    plan = estimate_inference(shape, params, device, precision, batch, seq_len)
    preset = recipe.model.preset
    result = dict(plan_json(plan, preset), task="inference", precision=precision)
    if not args.fit:
        return (json.dumps(result) if args.json else format_inference(plan, preset, precision)), int(not plan.fits)
    best, (last, closest) = fit_inference(shape, params, device, precision, batch, seq_len)
    result["recommended"] = dict(plan_json(best[1], preset), precision=best[0]) if best else None
    text = [f"as given: {precision}, {gb(plan.total_bytes)} GiB of {gb(device.usable_bytes)} GiB usable, "
            f"{'fits' if plan.fits else 'does not fit'}"]
    if best is None:
        text.append(f"no precision fits on {device.name}; the closest, {last}, needs "
                    f"{gb(closest.total_bytes - device.usable_bytes)} GiB more:\n"
                    + format_inference(closest, preset, last))
    else:
        text.append("recommended: " + format_inference(best[1], preset, best[0]))
    return (json.dumps(result) if args.json else "\n".join(text)), int(best is None)


def run_plan(args) -> tuple[str, int]:
    """(output, exit code) for the parsed `plan` arguments: 0 fits, 1 does not."""
    check_arguments(args)
    recipe, broken = plan_recipe(args)
    preset = recipe.model.preset
    device = get_device(recipe.device.name, recipe.device.max_device_memory)
    shape = resolve_shape(recipe.model)
    if args.task == "inference":
        return plan_inference(args, recipe, device, shape)
    base = planned_strategy(recipe, args, device.name)
    devices = args.devices or base.devices
    if devices != base.devices and not args.fit:
        raise RecipeError(f"--devices {devices}: the layout is data {base.data} x model {base.model} x pipeline "
                          f"{base.pipeline} = {base.devices}; set strategies.parallel or use --fit")
    params = cached_parameter_count(shape)
    plan = estimate(shape, params, device, base) if base.devices == devices else None
    rates = Rates(args.mfu or DEFAULT_MFU, args.peak_tflops, args.host_bandwidth)
    if not args.fit:
        return (json.dumps(plan_json(plan, preset, rates)) if args.json else
                format_plan(plan, preset, rates=rates)), int(not plan.fits)

    result = plan_json(plan, preset, rates) if plan else {"model": preset, "params": params, "device": device.name,
                                                              "devices": devices, "device_bytes": device.usable_bytes}
    if plan and plan.fits and not args.maximize:
        best = closest = plan  # a plan that fits is kept as given: only --maximize asks for changes
    else:
        best, closest = recommend(shape, params, device, base, devices, not args.no_lora, args.maximize,
                                  not args.no_offload, rates)
    result.update(recommended=plan_json(best, preset, rates) if best else None, unchanged=best is plan)
    # the recipe as given in one line: the table is the recommended plan's (or the closest one's)
    text = [as_given(plan, base, devices, broken)]
    if best is None:
        text.append(f"nothing fits on {devices} x {device.name}; the closest plan needs "
                    f"{gb(closest.total_bytes - device.usable_bytes)} GiB more per device:\n"
                    + format_plan(closest, preset, "closest: ", rates))
        return (json.dumps(result) if args.json else "\n".join(text)), 1
    text += [format_plan(best, preset, "recommended: ", rates),
             UNCHANGED if best is plan else changes(base, best.strategy)]
    if best.strategy.offload and not base.offload:
        text.append(offload_cost(best, rates.host_bandwidth))
    if args.write_recipe:
        schedule = write_recipe(recipe, best, Path(args.write_recipe))
        text.append(f"wrote {args.write_recipe}" + (f" (and changed: {', '.join(schedule)})" if schedule else ""))
        result["written_recipe"] = str(args.write_recipe)
    return (json.dumps(result) if args.json else "\n".join(text)), 0
