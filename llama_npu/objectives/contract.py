"""The objective contract: what every training objective gives the rest of the package, as
one abstract base class. Pure Python."""
from __future__ import annotations

from abc import ABC, abstractmethod
from types import MappingProxyType
from typing import Mapping, Optional, Tuple


class Objective(ABC):
    """A training objective (objectives/sft.py, dpo/, kto/), one instance of a subclass in
    objectives.OBJECTIVES. An abstract base rather than a typing.Protocol, so that the
    optional hooks have their defaults in one place and the callers (recipe/, training/,
    memory/, commands/evaluate.py) call every hook of every objective, asking none whether
    it has one. Python refuses to build a subclass missing a required part (the abstract
    NAME, RECORDS, check, samples, parts, plan_settings); the rest default to what SFT does.

    Its recipe section and checks
    - NAME (required): the value of train.objective that picks it ("sft", "dpo").
    - SECTION: the dataclass of its recipe section, under the key NAME (`dpo:`), or None.
      recipe/schema.py adds one field a SECTION, so a recipe always holds every section.
    - FOREIGN_NAMES: other trainers' keys for its own ({"pref_beta": "dpo.beta"}), which an
      unknown key's error names (recipe/foreign_names.py).
    - OLD_TRUNCATION: (key of its section, {value: data.truncation mode}) of a key that held
      data.truncation's mode before it existed, or None; recipe/stored.py reads a run's
      older recipe.yaml by it (objectives.old_truncation_keys).
    - resolve(recipe): reads a deprecated key of its section as its successor (recipe/load.py).
    - check(recipe) (required): see the method.

    The records it reads and how they become batches
    - RECORDS (required): a data/record_kind.py RecordKind: its parser of each format
      (parse(raw, where, options) -> record), the keys each reads (what the unread-column
      note leaves out; data.columns maps a file's column onto a key before any parser runs,
      data/tables.py), the test that a raw record is of its kind and the line refusing it
      when another objective reads it (a pair given to SFT), and the reason and line of its
      own refusal of another kind's records. objectives.records_of adds the other
      objectives' kinds, so each refuses the others'.
    - samples, preflight: see the methods.

    Its loss, reference and normaliser: parts (see the method). Its planner term:
    plan_settings. Its scoring: SCORES, score, score_line. Its rehearsal (training/rehearse.py
    and training/run.py): rehearse_length, rehearsal_source, rehearsal_notes.

    Shared parts for an objective's code: sequence_logps.py (per-sequence log-probs, full or
    chunked head), reference_pass.py (a precomputed reference over a source), adapters_off.py
    (the LoRA policy with its adapters off as the reference), rehearsal_length.py.
    """

    SECTION: Optional[type] = None
    FOREIGN_NAMES: Mapping[str, str] = MappingProxyType({})
    OLD_TRUNCATION: Optional[Tuple[str, dict]] = None
    # True when score and score_line give `eval --data`'s result for records of its kind;
    # False: such data is scored by its loss and perplexity (evaluation/perplexity.py).
    SCORES = False

    @property
    @abstractmethod
    def NAME(self) -> str:
        """train.objective's value that picks it."""

    @property
    @abstractmethod
    def RECORDS(self):
        """Its data/record_kind.py RecordKind."""

    @abstractmethod
    def check(self, recipe) -> None:
        """Raises RecipeError naming its problems. It runs for every objective, after the
        strategies' checks: its section's own keys always (they are in every recipe), the rest
        only when train.objective is NAME -- what it refuses of the data section (data.pack,
        data.prepared, a format it has no parser for, data.train_on_prompt, data.eval_files)
        and of the layouts (strategies.parallel). A section's keys are result keys: changing
        one on resume is refused without --force (training/preflight.py)."""

    @abstractmethod
    def samples(self, recipe, tokenizer, records):
        """(training source, held-out samples): the records read (`records`: its RECORDS from
        records_of; data.columns, data.encoding and data.on_bad_record through data/source.py
        read_records) and tokenized to data.max_seq_len + 1 tokens. The source is what
        data/batches.py BatchStream draws from: len(), iterate(indices) -> items; and, when
        its items are not SFT samples, pad(picked, length) -> the micro-batch's arrays,
        (input_ids, labels, *more), the rows of an item laid out as the loss cell reads them
        (DPO: P chosen rows, then P rejected; an objective may give 1, 2 or more rows an
        item, and extra arrays such as a reference). train.micro_batch_size and
        global_batch_size count items."""

    @abstractmethod
    def parts(self, recipe, run_dir, net, loss_cell, source, world):
        """objectives/parts.py ObjectiveParts, built by the session after the network
        (strategies/network.py gives the SFT loss cell) and before a resume loads trained
        weights: the loss cell ((input_ids, labels, *more[, embeds]) -> the micro-batch's loss,
        a SUM) and count(batch) (what that sum is over: target tokens, pairs; the step divides
        every micro-batch's sum by the count of the whole optimizer step, over every rank), and
        where it has them:
        - metrics() -> {name: value}, read once an optimizer step and logged by the loop into
          metrics.jsonl beside the loss (DPO: TRL's rewards/* and logps/*, summed by the loss
          cell into a Parameter and averaged over the step's items);
        - prepare(micro_batches) -> micro_batches: run by the loop on each step's k
          micro-batches (this rank's) before the step, and on the example batches a resume
          compiles with, for a quantity of the whole optimizer step (a KL estimate over every
          micro-batch, reduced across ranks by the hook itself) that the loss cell then reads
          as an extra array of each micro-batch;
        - sharded: for the sharded layout (the sharded step, ShardedStep): {"network":
          the loss as (numerator, denominator) for MindFormers' chain, "count": as above,
          "arrange": the row order a micro-batch goes in with}. Without it the sharded step
          runs MindFormers' own token loss (SFT's): any other objective gives it, or its check
          refuses the sharded layouts (strategies.parallel model, pipeline or optimizer_shard).
        A reference,
        where the loss needs one, is the objective's: computed before step 1 into its source
        (reference_pass.py: stored in the run directory with the digests of the starting
        weights and of the tokenized items, reused on resume when both match, refused
        otherwise), or in the step's graph (adapters_off.py)."""

    @abstractmethod
    def plan_settings(self, recipe) -> dict:
        """The planner Strategy's keys it sets (memory/planner.py): sequences_per_sample (rows
        an item is; more than one keeps them on one card, so the search offers no model or
        pipeline parallel), reference_forward (a forward without gradients in every
        micro-step, its own phase and 2 FLOPs a parameter and token; with optimizer_shard
        refused)."""

    def resolve(self, recipe) -> None:
        """A deprecated key of its section read as its successor; by default none."""

    def preflight(self, recipe, tokenizer, records) -> list:
        """The records' problems that tokenizing finds (a prompt leaving no room for a reply),
        as RecordErrors listed by `validate` and refused by `train` before anything is
        written; by default none."""
        return []

    def score(self, recipe, checkpoint, files, batch_size, device, load) -> dict:
        """`eval --data` of files whose records are of its kind (RECORDS.is_record of each
        file's first record), when SCORES: against the run's own recipe (None when the
        checkpoint belongs to no run: refuse it if the scores need the run); `load`
        (evaluation/loaded_model.py scoring_network) builds a checkpoint's network, handed in
        because evaluation/ sits above objectives/."""
        raise NotImplementedError(f"{self.NAME} has no scoring of its own (SCORES is False)")

    def score_line(self, result: dict) -> str:
        """score's result as eval prints it without --json."""
        raise NotImplementedError(f"{self.NAME} has no scoring of its own (SCORES is False)")

    def rehearse_length(self, r, shortest: int, items: int) -> int:
        """The rehearsal's data.max_seq_len: `train --rehearse` shrinks the sequence to
        `shortest`; an objective whose records need more (a prompt and a reply for `items`
        items) says what through r.change (training/rehearse.py). By default `shortest`."""
        return shortest

    def rehearsal_source(self, source, recipe):
        """The source a rehearsal trains on; by default the whole source (DPO: its first pairs
        only, so that the reference pass is as short as the rehearsal)."""
        return source

    def rehearsal_notes(self, recipe) -> list:
        """Lines for the rehearsal's summary saying what rehearsal_source takes; by default none."""
        return []
