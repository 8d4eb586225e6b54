"""A training run: `run_training` checks, tokenizes and opens the run directory;
`setup(recipe, run_dir, ...) -> Session` builds the network, train step, data stream,
evaluation, metrics and checkpointer and resumes; `run_loop(session, signals)` steps, logs,
evaluates and checkpoints.

Strategy logic lives in llama_npu/strategies and the checkpoint policy in checkpoints/policy.py;
this file only wires the pieces together and runs them in order, so the loop reads in one
sitting.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from ..checkpoints.files import inspect
from ..checkpoints.policy import Checkpointer
from ..common.console import note, progress_bar, warn
from ..common.stopping import StopSignals
from ..recipe.schema import Recipe, with_absolute_paths
from ..recipe.stored import STORED_RECIPE, stored_recipe
from ..strategies.accumulation import accumulation_steps
from .preflight import PreflightError, preflight, recipe_difference


def open_run_dir(run_dir: Path, recipe: Recipe, overwrite: bool) -> bool:
    """The point of no return, reached only once every check passed: clear the directory
    (--overwrite), create it and store the recipe. A resumed run keeps the recipe.yaml it
    was started with; its paths are stored absolute. Returns whether this run created the directory, so that a start-up
    failure after this point can remove it again."""
    if overwrite and run_dir.exists():
        shutil.rmtree(run_dir)
    created = not run_dir.is_dir() or not any(run_dir.iterdir())
    run_dir.mkdir(parents=True, exist_ok=True)
    stored = run_dir / STORED_RECIPE
    if not stored.exists():
        stored.write_text(yaml.safe_dump(with_absolute_paths(recipe).to_dict(), sort_keys=False, allow_unicode=True),
                          encoding="utf-8")
    return created


def compile_then_resume(step_fn, example_batches, checkpointer, path: Path, net, optimizer) -> dict:
    """Resume in MindFormers' order (base_trainer.training_process: compile_model, then
    load_checkpoint). A step that compiles ahead -- the sharded step, whose compile slices
    every Parameter to this rank's shard (mindspore/parallel/_utils.py) -- compiles before a
    rank_<R> shard is loaded into it; our own step has whole Parameters and compiles at its
    first call. `example_batches()` gives one step's micro-batches of the run's shapes."""
    compile_graph = getattr(step_fn, "compile", None)
    if compile_graph is not None:
        note("compiling the train graph before loading the checkpoint, so parameters have their sharded shapes")
        compile_graph(example_batches())
    return checkpointer.load(path, net, optimizer)


def _raw_samples(recipe: Recipe, tokenizer, files):
    from ..data.readers import read_dataset
    from ..data.samples import tokenize_records

    records, skipped = read_dataset(files, recipe.data.format, recipe.data.on_bad_record)
    if skipped.total:
        note(f"data.on_bad_record=skip: skipped {skipped.total} of {len(records) + skipped.total} records of "
             f"{', '.join(files)}: {skipped.describe()}")
    # A sample holds max_seq_len + 1 tokens: the model sees max_seq_len positions, each
    # predicting the next token.
    return tokenize_records(tokenizer, records, recipe.data.max_seq_len + 1, recipe.data.train_on_prompt)


def training_source(recipe: Recipe, tokenizer):
    """The sample source of the training set: a prepared MindRecord directory, or the raw
    files tokenized (and packed) in memory."""
    from ..data.batches import ListSamples
    from ..data.mindrecord import MindRecordSamples
    from ..data.packing import pack, padding_share

    d = recipe.data
    if d.prepared:
        # its length and tokenizer: preflight.check_prepared; a rehearsal's rows are cut to its length
        source = MindRecordSamples(Path(d.prepared), d.max_seq_len + 1)
        note(f"{len(source)} {'packed rows' if source.packed else 'samples'} from {d.prepared}")
        return source
    note(f"tokenizing {', '.join(d.train_files)}")
    samples, report = _raw_samples(recipe, tokenizer, d.train_files)
    if not samples:  # known only once tokenized: the pre-flight reads records, it does not tokenize them
        from ..data.readers import RecordError

        raise RecordError(f"no training sample left in {', '.join(d.train_files)}: all {report.read} records were "
                          f"dropped, none has an answer token within {d.max_seq_len + 1} tokens; raise "
                          f"data.max_seq_len")
    note(f"{report.kept} training samples ({report.truncated} truncated, "
         f"{report.dropped_no_answer} dropped: no answer token within {d.max_seq_len + 1} tokens)")
    if d.pack:
        rows = pack(samples, d.max_seq_len + 1)
        note(f"packed into {len(rows)} rows of {d.max_seq_len + 1} tokens "
             f"({padding_share(samples, len(rows), d.max_seq_len + 1):.1%} padding)")
        samples = rows
    return ListSamples(samples)


def pretrained_hf_config(recipe: Recipe) -> Optional[dict]:
    """The Hugging Face config the run started from, carried into its checkpoints."""
    if not recipe.model.checkpoint:
        return None
    from ..weights.pretrained import read_checkpoint_dir

    return read_checkpoint_dir(Path(recipe.model.checkpoint))[1].get("hf_config")


def planned_peak_bytes(recipe: Recipe, shape, params: int) -> int:
    """The planner's per-device peak for this recipe (its total less the free margin),
    logged beside the measured peak."""
    from ..memory.devices import get_device
    from ..memory.planner import estimate, strategy_from_recipe

    device = get_device(recipe.device.name, recipe.device.max_device_memory)
    plan = estimate(shape, params, device, strategy_from_recipe(recipe, recipe.device.name))
    return plan.total_bytes - plan.components["margin"]


def weights_digest(params) -> str:
    """SHA-256 of the trained weights' bytes: equal digests mean bit-identical weights."""
    digest = hashlib.sha256()
    for p in params:
        digest.update(p.asnumpy().tobytes())
    return digest.hexdigest()[:16]


@dataclass
class Session:
    """Everything the loop needs, built by `setup`: the network and its train step, the
    data stream at the step the run starts from, evaluation, metrics and checkpoints."""
    recipe: Recipe
    run_dir: Path
    world: object  # strategies.parallel.World
    on_ascend: bool
    net: object
    params: list
    optimizer: object
    scaler: object
    step_fn: object
    stream: object  # data.batches.BatchStream
    eval_cell: object
    eval_batch: int
    eval_samples: list
    checkpointer: Checkpointer
    metrics: Optional[object]  # metrics.MetricLogger on rank 0
    planned_peak: int
    start_step: int = 0
    rehearsal: Optional[dict] = None


def run_training(recipe: Recipe, run_dir: Path, signals: StopSignals, resume: Optional[str] = None,
                 overwrite: bool = False, force: bool = False, rehearsal: Optional[dict] = None) -> dict:
    """Check everything, then train. Nothing is written, deleted (--overwrite) or built
    before every pre-flight check and the tokenizing have passed; a start-up that fails or is
    interrupted (stopping.StopSignals) after that removes the run directory it created."""
    from ..common.frameworks import quiet_frameworks
    from ..common.launcher import launched_rank, launched_workers
    from ..data.tokenizer import load_tokenizer
    from .runtime import init_runtime

    run_dir = Path(run_dir)
    rank = launched_rank()
    problems, resume_candidates = preflight(recipe, run_dir, resume, overwrite, force, launched_workers(), rank == 0,
                                            rehearsal=rehearsal is not None)
    if problems:
        raise PreflightError(problems)
    stored = stored_recipe(run_dir) if resume else None
    if stored is not None:
        difference = recipe_difference(stored, recipe)
        if difference.changed:
            note(f"resuming with {difference.describe(difference.changed)}, unlike {run_dir / STORED_RECIPE} "
                 f"(kept as it was)")
    if resume == "auto" and not resume_candidates:
        note(f"resume: no checkpoint under {run_dir}/checkpoints; starting at step 0")

    tokenizer = load_tokenizer(recipe.data.tokenizer)
    train_source = training_source(recipe, tokenizer)  # a bad record deep in a file stops the run here
    eval_samples = _raw_samples(recipe, tokenizer, recipe.data.eval_files)[0] if recipe.data.eval_files else []
    # Under msrun only rank 0 clears and writes the run directory; the others read.
    with signals.creating_run_dir():
        created = open_run_dir(run_dir, recipe, overwrite) if rank == 0 else False
        if created:
            signals.remove_on_startup_signal(run_dir)
    try:
        quiet_frameworks(run_dir / "logs" if rank == 0 else
                         Path(tempfile.gettempdir()) / "llama-npu-logs" / run_dir.name / f"rank_{rank}")
        on_ascend = init_runtime(recipe)
        session = setup(recipe, run_dir, train_source, eval_samples, on_ascend,
                        resume_candidates if resume else None, warn_recipe_hash=stored is None)
        session.rehearsal = rehearsal
        return run_loop(session, signals)
    except BaseException:
        if created and not signals.training_started:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def setup(recipe: Recipe, run_dir: Path, train_source, eval_samples: list, on_ascend: bool,
          resume_candidates: Optional[list] = None, warn_recipe_hash: bool = False) -> Session:
    """Build the run: communication and layout, network, optimizer, train step, evaluation,
    checkpoints, then resume (`resume_candidates`, newest first; None: no resume asked) and
    place the data stream and metrics at the step it starts from."""
    from ..data.batches import BatchStream
    from ..model.architecture import resolve_shape
    from ..strategies.network import build_network
    from ..strategies.parallel import describe_layout, init_parallel, stream_layout
    from ..strategies.precision import LossScaler
    from .metrics import MetricLogger
    from .optimizer import build_optimizer
    from .sharded_step import eval_layout
    from .step import TrainStep

    t, parallel = recipe.train, recipe.strategies.parallel
    k = accumulation_steps(recipe)
    length = recipe.data.max_seq_len + 1
    world = init_parallel(parallel, run_dir)
    note(describe_layout(recipe))

    shape = resolve_shape(recipe.model)
    note(f"building the model{' and loading ' + recipe.model.checkpoint if recipe.model.checkpoint else ''}")
    net, loss_cell = build_network(recipe, on_ascend)
    params = net.trainable_params()
    # Sharded layouts step through MindFormers' wrappers, which need the schedule in the graph.
    optimizer = build_optimizer(params, t, schedule_in_graph=world.sharded)
    scaler = LossScaler(recipe.strategies.precision)
    if world.sharded:  # MindFormers' wrapper chain, one semi-auto graph
        from .sharded_step import ShardedStep

        step_fn = ShardedStep(net, optimizer, scaler, recipe)
    else:
        step_fn = TrainStep(loss_cell, optimizer, scaler, t.grad_clip, k)
    eval_cell, eval_batch = eval_layout(net, loss_cell, parallel, world, t.micro_batch_size)
    # LoRA checkpoints hold adapters only: they are not a whole model to describe.
    model_description = None if recipe.strategies.lora.enabled or world.sharded else {
        "format": "llama-npu", "shape": shape.__dict__, "dtype": str(params[0].dtype).lower(),
        "source": str(run_dir), "hf_config": pretrained_hf_config(recipe)}
    checkpointer = Checkpointer(run_dir, world, t.keep_last, model_description)
    batch_size, rank, ranks = stream_layout(parallel, world, t.micro_batch_size)

    start_step, samples_consumed = 0, 0
    if resume_candidates is not None:
        resume_from = checkpointer.choose(resume_candidates)
        start_step = inspect(resume_from)[0]["step"] if resume_from is not None else 0
        checkpointer.agree(start_step)
    if start_step:
        def example_batches():
            example = BatchStream(train_source, batch_size, length, t.seed, 0, rank, ranks)
            return [example.next_batch() for _ in range(k)]

        state = compile_then_resume(step_fn, example_batches, checkpointer, resume_from, net, optimizer)
        if warn_recipe_hash and state.get("recipe_hash") != recipe.digest():
            warn(f"the recipe differs from the one {resume_from} was trained with")
        samples_consumed = state["samples_consumed"]
        step_fn.load_loss_scale_state(state["loss_scale"])
        checkpointer.start_branch(start_step)
        note(f"resumed from {resume_from} at step {start_step}")
    stream = BatchStream(train_source, batch_size, length, t.seed, samples_consumed, rank, ranks)
    metrics = MetricLogger(run_dir, start_step) if world.is_main else None
    planned_peak = planned_peak_bytes(recipe, shape, sum(p.size for p in params))
    note(f"model {recipe.model.preset} ({shape.describe()}); {sum(p.size for p in params):,} trainable "
         f"parameters{'' if world.size == 1 else f' (rank {world.rank} of {world.size})'}")
    return Session(recipe, run_dir, world, on_ascend, net, params, optimizer, scaler, step_fn, stream, eval_cell,
                   eval_batch, eval_samples, checkpointer, metrics, planned_peak, start_step)


def save(session: Session, step: int) -> Path:
    """This rank's checkpoint of `step`; a failure stops the run, saying what survives."""
    from ..common.stopping import RunFailure, all_finite

    s, t = session, session.recipe.train
    last = s.checkpointer.last
    kept = f"the last complete checkpoint, {last}, is intact" if last else "no checkpoint of this run exists"
    if not all_finite(s.params):
        raise RunFailure(f"the weights after step {step} are not finite, so they were not saved; {kept}; "
                         f"lower train.optimizer.lr and resume from it")
    state = {"samples_consumed": s.stream.samples_consumed,
             "rng": {"seed": t.seed, "data_epoch": s.stream.epoch},
             "loss_scale": s.step_fn.loss_scale_state(), "recipe_hash": s.recipe.digest()}
    try:
        return s.checkpointer.save(step, s.params, s.optimizer, state)
    except OSError as exc:  # disk full, quota, read-only: say what survives, then stop
        raise RunFailure(f"could not write the checkpoint of step {step} under {s.checkpointer.root}: {exc}; "
                         f"training stopped at step {step} and {kept}; free space and resume with "
                         f"--resume auto") from exc


def run_loop(session: Session, signals: StopSignals) -> dict:
    """Step, log, evaluate and checkpoint from the session's start step to train.max_steps,
    or until a stop request (a signal to any rank); return the run's summary."""
    from ..common.stopping import NonFiniteStreak, RunFailure
    from ..evaluation.loss_loop import evaluate
    from ..memory.measure import current_rss, peak_memory
    from .optimizer import lr_at

    s = session
    t, world, stream, step_fn, metrics = s.recipe.train, s.world, s.stream, s.step_fn, s.metrics
    k, length, start_step = accumulation_steps(s.recipe), s.recipe.data.max_seq_len + 1, s.start_step
    note(f"training for {t.max_steps} steps, {k} micro-batch(es) of "
         f"{t.micro_batch_size} x {length} tokens per step and rank; the first step compiles the graph")
    first_loss = last_loss = None
    timed_tokens, timed_seconds = 0, 0.0
    streak = NonFiniteStreak(t.max_nonfinite_steps, s.scaler)
    # Ranks reading the step's tokens apart: under full_batch every sharded rank reads the global batch.
    token_readers = 1 if world.sharded else world.size
    step, stopped_by = start_step, None
    progress = progress_bar(t.max_steps, "train", "step", initial=start_step, enabled=world.is_main)
    with signals.training(), progress, metrics or nullcontext():
        for step in range(start_step + 1, t.max_steps + 1):
            begin = time.perf_counter()
            batches = [stream.next_batch() for _ in range(k)]
            result = step_fn(batches, lr_at(step, t), stop_requested=signals.received is not None)
            seconds = time.perf_counter() - begin
            streak.update(step, result.overflow, result.loss_scale)
            input_tokens = sum(int((batch[0] != s.net.config.pad_token_id).sum()) for batch in batches)
            if step > start_step + 1:  # the first step of a process includes graph compilation
                timed_tokens, timed_seconds = timed_tokens + input_tokens, timed_seconds + seconds
            peak, source = peak_memory(s.on_ascend)
            record = {"step": step, "loss": result.loss, "lr": result.lr, "grad_norm": result.grad_norm,
                      "target_tokens": result.target_tokens, "tokens_per_s": input_tokens * token_readers / seconds,
                      "step_seconds": seconds, "loss_scale": result.loss_scale,
                      "overflow": result.overflow, "nonfinite_in_a_row": streak.count,
                      "samples_consumed": stream.samples_consumed, "peak_memory_bytes": peak,
                      "memory_source": source, "planned_peak_bytes": s.planned_peak, "host_rss_bytes": current_rss()}
            if s.eval_samples and t.eval_every and step % t.eval_every == 0:
                record["eval_loss"] = evaluate(s.eval_cell, s.eval_samples, s.eval_batch, length)[0]
            if metrics:
                metrics.log(record)
            first_loss = result.loss if first_loss is None else first_loss
            last_loss = result.loss
            progress.set_postfix(loss=f"{result.loss:.4f}", lr=f"{result.lr:.2e}")
            progress.update(1)
            if streak.exhausted:
                raise RunFailure(streak.message(step, s.checkpointer.last))
            # Every rank must stop at the same step: under msrun the request is summed across ranks.
            stopping = result.stop_requested if world.size > 1 else signals.received is not None
            # A periodic save waits for a finite step, so no checkpoint holds a poisoned state.
            # The end and a stop save whatever the streak: a skipped step left the weights as
            # they were, and save() still refuses weights that are not finite.
            due = step == t.max_steps or stopping or (step % t.save_every == 0 and streak.count == 0)
            if s.checkpointer.saves and due:
                save(s, step)
            if stopping and step < t.max_steps:
                stopped_by = signals.received or "a signal to another rank"
                break

    summary = {"steps": step, "steps_this_run": step - start_step, "stopped_by": stopped_by,
               "first_loss": first_loss, "last_loss": last_loss,
               "tokens_per_s": timed_tokens * token_readers / timed_seconds if timed_seconds else None}
    if s.eval_samples and not stopped_by:  # a preempted job has seconds left, not minutes
        summary["eval_loss"], summary["eval_tokens"] = evaluate(s.eval_cell, s.eval_samples, s.eval_batch, length)
    peak, source = peak_memory(s.on_ascend)
    last = s.checkpointer.last
    summary.update({"peak_memory_bytes": peak, "memory_source": source,
                    # a rank that saves nothing would name the step it resumed from
                    "checkpoint": str(last) if last and s.checkpointer.saves else None,
                    "output_dir": str(s.run_dir)})
    if s.rehearsal:
        summary["rehearsal"] = s.rehearsal
    if world.size > 1:
        summary.update({"rank": world.rank, "workers": world.size, "weights_sha256": weights_digest(s.params)})
        note(f"rank {world.rank} weights sha256 {summary['weights_sha256']}")
    if world.is_main:
        (s.run_dir / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    if stopped_by:
        s.checkpointer.wait_for_every_rank()
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
        f"checkpoint     {summary['checkpoint'] or ('rank 0 saves it' if summary.get('rank') else None)}",
    ]
    if "eval_loss" in summary:
        lines.insert(2, f"held-out loss  {summary['eval_loss']:.4f} over {summary['eval_tokens']} target tokens")
    if "rehearsal" in summary:
        lines += [f"rehearsal      on the CPU; shrunk: {'; '.join(summary['rehearsal']['shrunk'])}"]
        lines += [f"not rehearsed  {item}" for item in summary["rehearsal"]["not_rehearsed"]]
    return "\n".join(lines)
