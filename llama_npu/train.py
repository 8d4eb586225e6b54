"""The training loop: build -> wrap -> step -> log -> checkpoint.

Strategy logic lives in llama_npu/strategies; this file only wires the pieces together and
runs them in order, so the whole loop reads in one sitting.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Optional

import yaml

from .console import note, progress_bar, warn
from .recipe import Recipe, accumulation_steps


class RunDirError(RuntimeError):
    """The output directory cannot be used as asked (exists, no checkpoint to resume...)."""


def prepare_run_dir(run_dir: Path, resume: Optional[str], overwrite: bool,
                    check_empty: bool = True) -> list:
    """Check the output directory and return the checkpoints to resume from, newest first
    (the loop falls back to the next when one turns out damaged). Runs before anything is
    built, so a refused run costs nothing."""
    from .checkpoint import checkpoint_root, problem, read_state, step_dirs_newest_first

    if resume and overwrite:
        raise RunDirError("--resume and --overwrite exclude each other")
    if resume == "auto":
        root = checkpoint_root(run_dir)
        if (root / "rank_0").is_dir():  # sharded run: every rank holds the same steps
            root = root / "rank_0"
        found = step_dirs_newest_first(root)
        complete = [path for path in found if read_state(path) is not None]
        if found and not complete:
            reasons = "; ".join(f"{path.name}: {problem(path)}" for path in found)
            raise RunDirError(f"resume: none of the checkpoints under {root} is complete ({reasons}); "
                              f"pass --resume PATH to pick one, or --overwrite to start again")
        if not found:
            print(f"resume: no checkpoint under {run_dir}/checkpoints; starting at step 0")
        return complete
    if resume:
        path = Path(resume)
        if not path.is_dir() or read_state(path) is None:
            raise RunDirError(f"--resume {path}: not a complete checkpoint directory "
                              f"(expected a step_<N> directory holding model.ckpt, optimizer.ckpt "
                              f"and state.json)")
        return [path]
    if check_empty and run_dir.exists() and any(run_dir.iterdir()):
        if not overwrite:
            raise RunDirError(f"output directory {run_dir} is not empty; pass --resume auto to "
                              f"continue it or --overwrite to start again")
        shutil.rmtree(run_dir)
    return []


def check_writable(run_dir: Path) -> None:
    """Fail before training, not at the first checkpoint, when the output cannot be written."""
    probe = run_dir / ".write-probe"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise RunDirError(f"output directory {run_dir} is not writable: {exc}") from exc


def resume_state(candidates: list, net, optimizer) -> tuple[Optional[Path], Optional[dict]]:
    """Load the newest checkpoint that loads; warn about each that does not."""
    from .checkpoint import CheckpointError, load_checkpoint

    for path in candidates:
        note(f"loading checkpoint {path}")
        try:
            return path, load_checkpoint(path, net, optimizer)
        except CheckpointError as exc:
            if len(candidates) == 1:
                raise
            warn(f"skipping checkpoint {path}: {exc}")
    if candidates:
        raise CheckpointError(f"resume: no checkpoint among {', '.join(p.name for p in candidates)} "
                              f"under {candidates[0].parent} could be loaded (see the warnings above)")
    return None, None


def _raw_samples(recipe: Recipe, tokenizer, files):
    from .data.readers import read_records
    from .data.samples import tokenize_records

    # A sample holds max_seq_len + 1 tokens: the model sees max_seq_len positions, each
    # predicting the next token.
    return tokenize_records(tokenizer, read_records(files, recipe.data.format), recipe.data.max_seq_len + 1,
                            recipe.data.train_on_prompt)


def training_source(recipe: Recipe, tokenizer):
    """The sample source of the training set: a prepared MindRecord directory, or the raw
    files tokenized (and packed) in memory."""
    from .data.batches import ListSamples
    from .data.mindrecord import MindRecordSamples
    from .data.packing import pack
    from .data.tokenizer import tokenizer_identity

    d = recipe.data
    if d.prepared:
        source = MindRecordSamples(Path(d.prepared))
        meta = source.meta
        if meta["max_seq_len"] != d.max_seq_len:
            raise RunDirError(f"data.prepared={d.prepared} was prepared with --max-seq-len "
                              f"{meta['max_seq_len']}, but data.max_seq_len={d.max_seq_len}")
        if meta["tokenizer"]["sha256"] != tokenizer_identity(d.tokenizer)["sha256"]:
            raise RunDirError(f"data.prepared={d.prepared} was tokenized with {meta['tokenizer']['name']}, "
                              f"not data.tokenizer={d.tokenizer}")
        note(f"{len(source)} {'packed rows' if source.packed else 'samples'} from {d.prepared}")
        return source
    note(f"tokenizing {', '.join(d.train_files)}")
    samples, report = _raw_samples(recipe, tokenizer, d.train_files)
    note(f"{report.kept} training samples ({report.truncated} truncated, "
         f"{report.dropped_no_answer} dropped: no answer token within {d.max_seq_len + 1} tokens)")
    if d.pack:
        samples = pack(samples, d.max_seq_len + 1)
        note(f"packed into {len(samples)} rows of {d.max_seq_len + 1} tokens")
    return ListSamples(samples)


def pretrained_hf_config(recipe: Recipe) -> Optional[dict]:
    """The Hugging Face config the run started from, carried into its checkpoints."""
    if not recipe.model.checkpoint:
        return None
    from .convert import read_checkpoint_dir

    return read_checkpoint_dir(Path(recipe.model.checkpoint))[1].get("hf_config")


def planned_peak_bytes(recipe: Recipe, shape, params: int) -> int:
    """The planner's per-device peak for this recipe (its total less the free margin),
    logged beside the measured peak."""
    from .memory.devices import get_device
    from .memory.plan_command import strategy_from_recipe
    from .memory.planner import estimate

    device = get_device(recipe.device.name, recipe.device.max_device_memory)
    plan = estimate(shape, params, device, strategy_from_recipe(recipe, recipe.device.name))
    return plan.total_bytes - plan.components["margin"]


def weights_digest(params) -> str:
    """SHA-256 of the trained weights' bytes: equal digests mean bit-identical weights."""
    digest = hashlib.sha256()
    for p in params:
        digest.update(p.asnumpy().tobytes())
    return digest.hexdigest()[:16]


def run_training(recipe: Recipe, run_dir: Path, resume: Optional[str] = None,
                 overwrite: bool = False) -> dict:
    from .data.tokenizer import load_tokenizer
    from .strategies.parallel import launched_rank

    # Data problems surface before anything is written, deleted (--overwrite) or built.
    tokenizer = load_tokenizer(recipe.data.tokenizer)
    train_source = training_source(recipe, tokenizer)
    eval_samples = _raw_samples(recipe, tokenizer, recipe.data.eval_files)[0] if recipe.data.eval_files else []
    run_dir = Path(run_dir)
    main_rank = launched_rank() == 0
    # Under msrun only rank 0 checks, clears and writes the run directory; the others read.
    resume_candidates = prepare_run_dir(run_dir, resume, overwrite and main_rank, check_empty=main_rank)
    if main_rank:
        check_writable(run_dir)
        (run_dir / "recipe.yaml").write_text(
            yaml.safe_dump(recipe.to_dict(), sort_keys=False, allow_unicode=True), encoding="utf-8")

    from .runtime import init_runtime, quiet_frameworks

    quiet_frameworks(run_dir / "logs" if main_rank else
                     Path(tempfile.gettempdir()) / "llama-npu-logs" / run_dir.name / f"rank_{launched_rank()}")
    on_ascend = init_runtime(recipe)

    from .build import build_network
    from .evaluate import evaluate
    from .checkpoint import checkpoint_root, optimizer_state_params, save_checkpoint
    from .data.batches import BatchStream
    from .memory.measure import current_rss, peak_memory
    from .metrics import MetricLogger
    from .model import resolve_shape
    from .optim import build_optimizer, lr_at
    from .strategies.accumulation import TrainStep
    from .strategies.parallel import init_parallel, stream_layout, wrap_loss_cell
    from .strategies.precision import LossScaler
    from .stopping import NonFiniteStreak, RunFailure, StopSignals, all_finite

    t = recipe.train
    k = accumulation_steps(recipe)
    length = recipe.data.max_seq_len + 1
    world = init_parallel(recipe.strategies.parallel, run_dir)

    shape = resolve_shape(recipe.model)
    note(f"building the model{' and loading ' + recipe.model.checkpoint if recipe.model.checkpoint else ''}")
    net, loss_cell = build_network(recipe, on_ascend)
    params = net.trainable_params()
    optimizer = build_optimizer(params, t)
    scaler = LossScaler(recipe.strategies.precision)
    parallel = recipe.strategies.parallel
    step_fn = TrainStep(wrap_loss_cell(loss_cell, parallel, world), optimizer, scaler, t.grad_clip, k)
    ckpt_root = checkpoint_root(run_dir, world)
    planned_peak = planned_peak_bytes(recipe, shape, sum(p.size for p in params))
    # LoRA checkpoints hold adapters only: they are not a whole model to describe.
    model_description = None if recipe.strategies.lora.enabled or world.sharded else {
        "format": "llama-npu", "shape": shape.__dict__, "dtype": str(params[0].dtype).lower(),
        "source": str(run_dir), "hf_config": pretrained_hf_config(recipe)}

    start_step, samples_consumed = 0, 0
    if world.sharded:  # each rank resumes its own shard of the same step
        resume_candidates = [ckpt_root / path.name for path in resume_candidates]
    resume_from, state = resume_state(resume_candidates, net, optimizer)
    if resume_from is not None:
        if state.get("recipe_hash") != recipe.digest():
            warn(f"the recipe differs from the one {resume_from} was trained with")
        start_step, samples_consumed = state["step"], state["samples_consumed"]
        step_fn.load_loss_scale_state(state["loss_scale"])
        note(f"resumed from {resume_from} at step {start_step}")
    batch_size, rank, ranks = stream_layout(parallel, world, t.micro_batch_size)
    stream = BatchStream(train_source, batch_size, length, t.seed, samples_consumed, rank, ranks)
    metrics = MetricLogger(run_dir, start_step) if world.is_main else None
    saves_checkpoints = world.is_main or world.sharded
    last_path = resume_from

    def checkpoint(step: int) -> Path:
        kept = (f"the last complete checkpoint, {last_path}, is intact" if last_path else
                "no checkpoint of this run exists")
        if not all_finite(params):
            raise RunFailure(f"the weights after step {step} are not finite, so they were not saved; {kept}; "
                             f"lower train.optimizer.lr and resume from it")
        state = {"samples_consumed": stream.samples_consumed,
                 "rng": {"seed": t.seed, "data_epoch": stream.epoch},
                 "loss_scale": step_fn.loss_scale_state(), "recipe_hash": recipe.digest()}
        try:
            return save_checkpoint(ckpt_root, step, params, optimizer_state_params(optimizer, params),
                                   state, t.keep_last, model_description)
        except OSError as exc:  # disk full, quota, read-only: say what survives, then stop
            raise RunFailure(f"could not write the checkpoint of step {step} under {ckpt_root}: {exc}; "
                             f"training stopped at step {step} and {kept}; free space and resume with "
                             f"--resume auto") from exc

    trainable = sum(p.size for p in params)
    note(f"model {recipe.model.preset} ({shape.describe()}); {trainable:,} trainable "
         f"parameters{'' if world.size == 1 else f' (rank {world.rank} of {world.size})'}")
    note(f"training for {t.max_steps} steps, {k} micro-batch(es) of "
         f"{t.micro_batch_size} x {length} tokens per step and rank; the first step compiles the graph")
    first_loss = last_loss = None
    timed_tokens, timed_seconds = 0, 0.0
    streak = NonFiniteStreak(t.max_nonfinite_steps, scaler)
    step, stopped_by = start_step, None
    progress = progress_bar(t.max_steps, "train", "step", initial=start_step, enabled=world.is_main)
    with StopSignals() as signals, progress, metrics or nullcontext():
        for step in range(start_step + 1, t.max_steps + 1):
            begin = time.perf_counter()
            batches = [stream.next_batch() for _ in range(k)]
            lr = lr_at(step, t)
            result = step_fn(batches, lr, stop_requested=signals.received is not None)
            seconds = time.perf_counter() - begin
            streak.update(step, result.overflow, result.loss_scale)
            input_tokens = sum(int((batch[0] != net.config.pad_token_id).sum()) for batch in batches)
            if step > start_step + 1:  # the first step of a process includes graph compilation
                timed_tokens, timed_seconds = timed_tokens + input_tokens, timed_seconds + seconds
            peak, source = peak_memory(on_ascend)
            record = {"step": step, "loss": result.loss, "lr": lr, "grad_norm": result.grad_norm,
                      "target_tokens": result.target_tokens, "tokens_per_s": input_tokens * world.size / seconds,
                      "step_seconds": seconds, "loss_scale": result.loss_scale,
                      "overflow": result.overflow, "nonfinite_in_a_row": streak.count,
                      "samples_consumed": stream.samples_consumed, "peak_memory_bytes": peak,
                      "memory_source": source, "planned_peak_bytes": planned_peak, "host_rss_bytes": current_rss()}
            if eval_samples and t.eval_every and step % t.eval_every == 0:
                record["eval_loss"] = evaluate(loss_cell, eval_samples, t.micro_batch_size, length)[0]
            if metrics:
                metrics.log(record)
            first_loss = result.loss if first_loss is None else first_loss
            last_loss = result.loss
            progress.set_postfix(loss=f"{result.loss:.4f}", lr=f"{lr:.2e}")
            progress.update(1)
            if streak.exhausted:
                raise RunFailure(streak.message(step, last_path))
            # Every rank must stop at the same step: under msrun the request is summed across ranks.
            stopping = result.stop_requested if world.size > 1 else signals.received is not None
            due = step % t.save_every == 0 or step == t.max_steps or stopping
            # Weights are saved only after a finite step, so no checkpoint holds a poisoned state.
            if saves_checkpoints and due and streak.count == 0:
                last_path = checkpoint(step)
            if stopping and step < t.max_steps:
                stopped_by = signals.received or "a signal to another rank"
                break

    summary = {"steps": step, "steps_this_run": step - start_step, "stopped_by": stopped_by,
               "first_loss": first_loss, "last_loss": last_loss,
               "tokens_per_s": timed_tokens * world.size / timed_seconds if timed_seconds else None}
    if eval_samples and not stopped_by:  # a preempted job has seconds left, not minutes
        summary["eval_loss"], summary["eval_tokens"] = evaluate(
            loss_cell, eval_samples, t.micro_batch_size, length)
    peak, source = peak_memory(on_ascend)
    summary.update({"peak_memory_bytes": peak, "memory_source": source,
                    "checkpoint": str(last_path) if last_path else None, "output_dir": str(run_dir)})
    if world.size > 1:
        summary.update({"rank": world.rank, "workers": world.size, "weights_sha256": weights_digest(params)})
        note(f"rank {world.rank} weights sha256 {summary['weights_sha256']}")
    if world.is_main:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return summary


def format_summary(summary: dict) -> str:
    where = {"device": "NPU device memory (mindspore.runtime)",
             "host_rss": "host peak RSS; CPU memory is no proxy for NPU memory"}[summary["memory_source"]]
    rate = summary["tokens_per_s"]
    lines = [
        f"steps          {summary['steps']} ({summary['steps_this_run']} in this run)",
        f"loss           {summary['first_loss']:.4f} (first) -> {summary['last_loss']:.4f} (last)"
        if summary["first_loss"] is not None else "loss           (no step ran)",
        f"tokens/s       {rate:,.0f} (excluding the compiling first step)" if rate else
        "tokens/s       n/a (too few steps to time)",
        f"peak memory    {summary['peak_memory_bytes'] / 2**30:.2f} GiB, {where}",
        f"checkpoint     {summary['checkpoint']}",
    ]
    if "eval_loss" in summary:
        lines.insert(2, f"held-out loss  {summary['eval_loss']:.4f} over {summary['eval_tokens']} target tokens")
    return "\n".join(lines)
