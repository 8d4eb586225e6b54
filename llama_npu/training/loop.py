"""`run_loop(session, signals)`: step, log, evaluate and checkpoint from the session's start
step to train.max_steps or a stop request, then write the run's summary."""
from __future__ import annotations

import json
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Optional

from ..common.console import note, progress_bar
from ..common.stopping import RunFailure, StopSignals
from ..evaluation.loss_loop import evaluate
from ..memory.measure import current_rss, peak_memory
from ..objectives.reference_pass import weights_digest
from ..report.journal import RunJournal
from ..report.sparkline import sparkline
from ..strategies.accumulation import accumulation_steps
from .nonfinite import NonFiniteStreak, all_finite
from ..steps.optimizer import lr_at
from .session import Session
from ..steps import StepResult


def save(session: Session, step: int) -> Optional[Path]:
    """This rank's checkpoint of `step` (None: a rank that only sent its states to rank 0); a
    failure stops the run, saying what survives."""
    s, t = session, session.recipe.train
    last = s.checkpointer.last
    kept = f"the last complete checkpoint, {last}, is intact" if last else "no checkpoint of this run exists"
    params, optimizer = s.step_fn.states_to_save()  # a collective where each rank holds a range of them
    if not s.checkpointer.saves:
        return None
    if not all_finite(params):
        raise RunFailure(f"the weights after step {step} are not finite, so they were not saved; {kept}; "
                         f"lower train.optimizer.lr and resume from it")
    state = {"samples_consumed": s.stream.samples_consumed,
             "rng": {"seed": t.seed, "data_epoch": s.stream.epoch},
             "loss_scale": s.step_fn.loss_scale_state(), "recipe_hash": s.recipe.digest(),
             "schedule_steps": s.schedule_steps}  # a resume keeps it (recipe/resume_checks.py)
    try:
        return s.checkpointer.save(step, params, optimizer, state)
    except OSError as exc:  # disk full, quota, read-only: say what survives, then stop
        raise RunFailure(f"could not write the checkpoint of step {step} under {s.checkpointer.root}: {exc}; "
                         f"training stopped at step {step} and {kept}; free space and resume with "
                         f"--resume auto") from exc


def held_out(s: Session) -> dict:
    """The held-out loss and the target tokens it is over."""
    loss, tokens = evaluate(s.eval_cell, s.eval_samples, s.eval_batch, s.recipe.data.max_seq_len + 1)
    return {"eval_loss": loss, "eval_tokens": tokens}


def step_record(s: Session, step: int, result: StepResult, tokens_per_s: float, seconds: float,
                nonfinite_in_a_row: int) -> dict:
    """metrics.jsonl's line of `step`, with the held-out loss on train.eval_every's steps and
    at train.max_steps (the end-of-run figure summary.json repeats)."""
    t = s.recipe.train
    peak, source = peak_memory(s.on_ascend)
    record = {"step": step, "loss": result.loss, "lr": result.lr, "grad_norm": result.grad_norm,
              "target_tokens": result.target_tokens, "tokens_per_s": tokens_per_s,
              "step_seconds": seconds, "loss_scale": result.loss_scale,
              "overflow": result.overflow, "nonfinite_in_a_row": nonfinite_in_a_row,
              "samples_consumed": s.stream.samples_consumed, "peak_memory_bytes": peak,
              "memory_source": source, "planned_peak_bytes": s.planned_peak, "host_rss_bytes": current_rss()}
    if s.objective.metrics is not None:  # the objective's own (DPO: TRL's rewards/* and logps/*)
        record.update(s.objective.metrics())
    if s.eval_samples and (step == t.max_steps or (t.eval_every and step % t.eval_every == 0)):
        record.update(held_out(s))
    return record


def run_summary(s: Session, steps: int, stopped_by: Optional[str], losses: list, tokens_per_s: Optional[float],
                last_record: Optional[dict] = None) -> dict:
    """The run's summary (summary.json on rank 0): steps, first and last loss, held-out
    loss (the last step's record's), throughput, peak memory, the newest checkpoint."""
    world = s.world
    summary = {"steps": steps, "steps_this_run": steps - s.start_step, "stopped_by": stopped_by,
               "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
               "loss_sparkline": sparkline(losses), "tokens_per_s": tokens_per_s}
    if last_record and "eval_loss" in last_record:
        summary.update(eval_loss=last_record["eval_loss"], eval_tokens=last_record["eval_tokens"])
    elif s.eval_samples and not stopped_by:  # a run resumed at its end; a preempted job has seconds left, not minutes
        summary.update(held_out(s))
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


def run_loop(session: Session, signals: StopSignals) -> dict:
    """Step, log, evaluate and checkpoint from the session's start step to train.max_steps,
    or until a stop request (a signal to any rank); return the run's summary."""
    s = session
    t, world, start_step = s.recipe.train, s.world, s.start_step
    streak = NonFiniteStreak(t.max_nonfinite_steps, s.scaler)
    k = accumulation_steps(s.recipe)
    left = f"{t.max_steps - start_step} of {t.max_steps} steps left" if start_step else f"{t.max_steps} steps"
    note(f"training for {left}, {k} micro-batch(es) of {t.micro_batch_size} x "
         f"{s.recipe.data.max_seq_len + 1} tokens per step and rank; the first step compiles the graph")
    losses, timed_tokens, timed_seconds = [], 0, 0.0
    # Ranks reading the step's tokens apart: under full_batch every sharded rank reads the global batch.
    token_readers = 1 if world.sharded else world.size
    step, stopped_by = start_step, None
    progress = progress_bar(t.max_steps, "train", "step", initial=start_step, enabled=world.is_main)
    journal, record = RunJournal(s.run_dir, world.is_main, t.plots), None
    journal.started(start_step, s.checkpointer.last, s.metrics.discarded if s.metrics else 0)
    with signals.training(), progress, s.metrics or nullcontext(), journal.failures(lambda: step):
        for step in range(start_step + 1, t.max_steps + 1):
            begin = time.perf_counter()
            batches = s.objective.prepared([s.stream.next_batch() for _ in range(k)])
            result = s.step_fn(batches, lr_at(step, t, s.schedule_steps), stop_requested=signals.received is not None)
            seconds = time.perf_counter() - begin
            streak.update(step, result.overflow, result.loss_scale)
            input_tokens = sum(int((batch[0] != s.net.config.pad_token_id).sum()) for batch in batches)
            if step > start_step + 1:  # the first step of a process includes graph compilation
                timed_tokens, timed_seconds = timed_tokens + input_tokens, timed_seconds + seconds
            record = step_record(s, step, result, input_tokens * token_readers / seconds, seconds, streak.count)
            if s.metrics:
                s.metrics.log(record)
            losses.append(result.loss)
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
            if stopping and step < t.max_steps:
                stopped_by = signals.received or "a signal to another rank"
            if due and (s.checkpointer.saves or s.step_fn.states_in_ranges):  # in ranges: every rank sends its own
                save(s, step)
                journal.saved(step, last=step == t.max_steps or stopped_by is not None, stopped_by=stopped_by)
            if stopped_by:
                break
    return run_summary(s, step, stopped_by, losses,
                       timed_tokens * token_readers / timed_seconds if timed_seconds else None, record)
