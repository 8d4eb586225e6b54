"""The training objectives, one module (or package) each, picked by `train.objective`: what a
step's loss is, whereas a strategy (strategies/) changes how the same loss is computed. The
recipe, the data readers, the session, the loop, the steps, the planner, rehearse, the
pre-flight and `eval --data` go through OBJECTIVES and name no objective; an objective's
code, messages aside, lives here.

Each objective module owns, as a strategy owns its part:

Its recipe section and checks
- NAME: the value of train.objective that picks it ("sft", "dpo").
- SECTION: the dataclass of its recipe section, under the key NAME (`dpo:`), or None.
  recipe/schema.py adds one field a SECTION, so a recipe always holds every section.
- FOREIGN_NAMES: other trainers' keys for its own ({"pref_beta": "dpo.beta"}), which an
  unknown key's error names (recipe/foreign_names.py).
- check(recipe): raises RecipeError naming its problems. It runs for every objective, after
  the strategies' checks: its section's own keys always (they are in every recipe), the rest
  only when train.objective is NAME -- what it refuses of the data section (data.pack,
  data.prepared, a format it has no parser for, data.train_on_prompt, data.eval_files) and
  of the layouts (strategies.parallel). A section's keys are result keys: changing one on
  resume is refused without --force (training/preflight.py).

The records it reads and how they become batches
- RECORDS: a data/record_kind.py RecordKind: its parser of each format (parse(raw, where,
  options) -> record), the keys each reads (what the unread-column note leaves out; data.columns maps
  a file's column onto a key before any parser runs, data/tables.py), the test that a raw
  record is of its kind and the line refusing it when another objective reads it (a pair
  given to SFT), and the reason and line of its own refusal of another kind's records.
  records_of(objective) adds the other objectives' kinds, so each refuses the others'.
- samples(recipe, tokenizer, records) -> (training source, held-out samples): the records
  read (`records`: its RECORDS from records_of; data.columns, data.encoding and
  data.on_bad_record through data/source.py read_records) and tokenized to
  data.max_seq_len + 1 tokens. The source is what data/batches.py BatchStream draws from:
  len(), iterate(indices) -> items; and, when its items are not SFT samples,
  pad(picked, length) -> the micro-batch's arrays, (input_ids, labels, *more), the rows of
  an item laid out as the loss cell reads them (DPO: P chosen rows, then P rejected; an
  objective may give 1, 2 or more rows an item, and extra arrays such as a reference).
  train.micro_batch_size and global_batch_size count items.
- preflight(recipe, tokenizer, records) -> [RecordError] (optional): the records' problems
  that tokenizing finds (a prompt leaving no room for a reply), listed by `validate` and
  refused by `train` before anything is written.

Its loss, reference and normaliser
- parts(recipe, run_dir, net, loss_cell, source, world) -> objectives/parts.py
  ObjectiveParts, built by the session after the network (strategies/network.py gives the
  SFT loss cell) and before a resume loads trained weights:
  - loss_cell: (input_ids, labels, *more[, embeds]) -> the micro-batch's loss, a SUM;
  - count(batch) -> what that sum is over (target tokens; DPO: pairs). The step divides
    every micro-batch's sum by the count of the whole optimizer step (over every rank),
    so accumulation is exact;
  - a reference, where the loss needs one, is the objective's: computed before step 1 into
    its source (objectives/reference_pass.py: a forward over every item, stored in the run
    directory with the digests of the starting weights and of the tokenized items, reused
    on resume when both match, refused otherwise), or in the step's graph (adapters_off.py);
  - metrics() -> {name: value} (optional), read once an optimizer step and logged by the
    loop into metrics.jsonl beside the loss (DPO: TRL's rewards/* and logps/*, summed by
    the loss cell into a Parameter and averaged over the step's items);
  - prepare(micro_batches) -> micro_batches (optional): run by the loop on each step's k
    micro-batches (this rank's) before the step, and on the example batches a resume
    compiles with, for a quantity of the whole optimizer step (a KL estimate over every
    micro-batch, reduced across ranks by the hook itself) that the loss cell then reads as
    an extra array of each micro-batch;
  - sharded (optional): for the sharded layout (steps/sharded_step.py ShardedStep):
    {"network": the loss as (numerator, denominator) for MindFormers' chain, "count": as
    above, "arrange": the row order a micro-batch goes in with}. Without it the sharded step
    runs MindFormers' own token loss (SFT's): any other objective gives it, or its check
    refuses the sharded layouts (strategies.parallel model, pipeline or optimizer_shard).

Its scoring, planner term and rehearsal
- score(recipe, checkpoint, files, batch_size, device, load) -> dict and
  score_line(result) -> str (optional): `eval --data` of files whose records are of its
  kind (RECORDS.is_record of each file's first record), against the run's own recipe (None
  when the checkpoint belongs to no run: refuse it if the scores need the run); `load`
  (evaluation/loaded_model.py scoring_network) builds a checkpoint's network, handed in
  because evaluation/ sits above objectives/. SFT's is eval's default, the loss and
  perplexity (evaluation/perplexity.py).
- plan_settings(recipe) -> the planner Strategy's keys it sets (memory/planner.py):
  sequences_per_sample (rows an item is; more than one keeps them on one card, so the
  search offers no model or pipeline parallel), reference_forward (a forward without
  gradients in every micro-step, its own phase and 2 FLOPs a parameter and token; with
  optimizer_shard refused).
- rehearse_length(r, shortest, items) -> the rehearsal's data.max_seq_len (optional):
  `train --rehearse` shrinks the sequence to `shortest`; an objective whose records need
  more (a prompt and a reply) says what, through r.change (training/rehearse.py).
- rehearsal_source(source, recipe) -> the source a rehearsal trains on, and
  rehearsal_notes(rehearsal recipe) -> lines for its summary (optional): DPO trains on its first
  pairs only, so that the reference pass is as short as the rehearsal.

Adding an objective (a reward model, KTO): write its module here with the names above, add
it to OBJECTIVES, and give it its recipe, data, docs and tests; nothing outside objectives/
changes. Shared parts: sequence_logps.py (per-sequence log-probs, full or chunked head),
reference_pass.py (a precomputed reference over a source), adapters_off.py (the LoRA
policy with its adapters off as the reference).
"""
from __future__ import annotations

import dataclasses
import importlib

# train.objective's values, in the order validate names them: an objective is registered by
# adding its module's name here, one line in its commit (the modules import as the package's).
OBJECTIVES = tuple(importlib.import_module(f"{__name__}.{name}") for name in ("sft", "dpo", "kto"))
NAMES = tuple(objective.NAME for objective in OBJECTIVES)


def old_truncation_keys() -> list:
    """(section, key, {value: mode}) of the objectives' keys that held data.truncation's mode
    before it existed: recipe/stored.py reads a run's older recipe.yaml by them."""
    return [(o.NAME, *o.OLD_TRUNCATION) for o in OBJECTIVES if getattr(o, "OLD_TRUNCATION", None)]


def named(name: str):
    """The objective module train.objective `name` picks (validate refuses any other name)."""
    return {objective.NAME: objective for objective in OBJECTIVES}[name]


def of(recipe):
    """The recipe's objective module."""
    return named(recipe.train.objective)


def records_of(objective):
    """The objective's RecordKind, refusing the other objectives' records by name."""
    others = tuple(other.RECORDS for other in OBJECTIVES if other is not objective)
    return dataclasses.replace(objective.RECORDS, others=others)


def run_samples(recipe):
    """(the training source, the held-out samples) of the recipe's objective, one tokenizer
    for both. A bad record deep in a file stops the run here, before its directory is touched."""
    from ..data.tokenizer import load_tokenizer  # imported here: it loads tokenizers, validate's checks before not

    objective = of(recipe)
    return objective.samples(recipe, load_tokenizer(recipe.data.tokenizer), records_of(objective))


def scoring(is_of_kind):
    """The objective other than SFT whose records `is_of_kind(kind)` says the eval data is,
    or None (eval --data then scores loss and perplexity)."""
    for objective in OBJECTIVES:
        if hasattr(objective, "score") and is_of_kind(objective.RECORDS):
            return objective
    return None
