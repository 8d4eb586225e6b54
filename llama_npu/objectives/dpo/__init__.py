"""train.objective: dpo, preference tuning on pairs (TRL 0.24.0's DPO, IPO, SimPO and ORPO),
behind the objective contract (objectives/contract.py):
- section.py: the `dpo:` section and its checks (pure Python);
- records.py: the pair records of each format (pure Python), pairs.py: tokenized into two
  rows sharing the prompt; source.py: the pairs as a BatchStream source, with the reference;
- loss.py: the losses and the loss cell; parts.py: the run's set-up (the precomputed
  reference, objectives/reference_pass.py); sharded.py: the sharded layout's order;
- scoring.py: `eval --data PAIRS`; rehearsal.py: `train --rehearse`'s length and pairs.
Its heavy modules (numpy, MindSpore) are imported where they are used, so `validate` and
`plan` load neither."""
from __future__ import annotations

from ..contract import Objective
from . import section
from .records import RECORDS as PAIR_RECORDS


class Dpo(Objective):
    NAME = section.NAME
    SECTION = section.DpoSection
    OLD_TRUNCATION = section.OLD_TRUNCATION
    RECORDS = PAIR_RECORDS
    SCORES = True
    # LLaMA-Factory's (its FinetuningArguments)
    FOREIGN_NAMES = {"pref_beta": "dpo.beta", "pref_loss": "dpo.loss",
                     "pref_ftx": "dpo.orpo_lambda (ORPO's NLL weight)"}
    check = staticmethod(section.check)
    resolve = staticmethod(section.resolve)

    def samples(self, recipe, tokenizer, records):
        """(the training pairs as a source, no held-out samples: check refuses data.eval_files)."""
        from ...data.dataset_info import train_inputs
        from .source import PairSource, pair_samples

        return PairSource(pair_samples(recipe, tokenizer, train_inputs(recipe), records)), []

    def preflight(self, recipe, tokenizer, records) -> list:
        """The pairs whose prompt leaves no reply token within data.max_seq_len (data.truncation:
        keep_prompt), as errors."""
        from ..prompt_room import no_room_errors
        from .pairs import tokenize_pairs
        from .records import SKIP_HINT

        return no_room_errors(tokenize_pairs, tokenizer, records, recipe, SKIP_HINT)

    def parts(self, recipe, run_dir, net, loss_cell, source, world):
        from .parts import preference_parts

        return preference_parts(recipe, run_dir, net, source, world)

    def plan_settings(self, recipe) -> dict:
        """A pair is 2 rows in one forward pass (loss.py), on one card; adapters_off's reference
        is a forward without gradients in every micro-step."""
        return {"sequences_per_sample": 2, "reference_forward": recipe.dpo.reference == "adapters_off"}

    def score(self, recipe, checkpoint, files, batch_size, device, load) -> dict:
        from .scoring import evaluate_pairs

        return evaluate_pairs(recipe, checkpoint, files, batch_size, device, load)

    def score_line(self, result: dict) -> str:
        return (f"DPO loss {result['loss']:.4f} ({result['dpo_loss']}), reward accuracy "
                f"{result['rewards/accuracies']:.3f}, margin {result['rewards/margins']:.4f} over {result['pairs']} "
                f"pairs, against the reference {result['reference']}")

    def rehearse_length(self, r, shortest: int, items: int) -> int:
        from .rehearsal import shrink_pair_length

        return shrink_pair_length(r, shortest, items)

    def rehearsal_source(self, source, recipe):
        from .rehearsal import first_pairs

        return first_pairs(source, recipe)

    def rehearsal_notes(self, recipe) -> list:
        from .rehearsal import rehearsal_notes as notes

        return notes(recipe)


OBJECTIVE = Dpo()
