"""train.objective: kto, KTO on single replies with a thumbs up or down (TRL 0.24.0's
KTOTrainer), behind the objective contract (objectives/contract.py):
- section.py: the `kto:` section and its checks (pure Python);
- records.py: the labelled replies of each format (pure Python); replies.py: tokenized, as
  the run's source, and the KL rows; reference.py: the precomputed reference;
- loss.py: the loss, the loss cell and the KL pass; kl_estimate.py: the KL once an
  optimizer step; parts.py: the run's set-up;
- scoring.py: `eval --data FILE`; rehearsal.py: `train --rehearse`'s length and records.
Its heavy modules (numpy, MindSpore) are imported where they are used, so `validate` and
`plan` load neither."""
from __future__ import annotations

from ..contract import Objective
from . import section
from .records import RECORDS as REPLY_RECORDS


class Kto(Objective):
    NAME = section.NAME
    SECTION = section.KtoSection
    RECORDS = REPLY_RECORDS
    SCORES = True
    # LLaMA-Factory's (its FinetuningArguments; its pref_beta is dpo.beta's name there too)
    FOREIGN_NAMES = {"kto_chosen_weight": "kto.desirable_weight", "kto_rejected_weight": "kto.undesirable_weight"}
    check = staticmethod(section.check)

    def samples(self, recipe, tokenizer, records):
        """(the labelled replies as a source, no held-out samples: check refuses data.eval_files)."""
        from ...data.dataset_info import train_inputs
        from .replies import KtoSource, reply_samples

        return KtoSource(reply_samples(recipe, tokenizer, train_inputs(recipe), records)), []

    def preflight(self, recipe, tokenizer, records) -> list:
        """The records whose prompt leaves no reply token within data.max_seq_len (data.truncation:
        keep_prompt), as errors."""
        from ..prompt_room import no_room_errors
        from .records import SKIP_HINT
        from .replies import tokenize_kto

        return no_room_errors(tokenize_kto, tokenizer, records, recipe, SKIP_HINT)

    def parts(self, recipe, run_dir, net, loss_cell, source, world):
        from .parts import kto_parts

        return kto_parts(recipe, run_dir, net, source, world)

    def plan_settings(self, recipe) -> dict:
        """One row a record; the KL pass before each step is a forward without gradients (a phase
        of its own, as an adapters-off reference's, which then runs in every micro-step too)."""
        return {"sequences_per_sample": 1, "reference_forward": True}

    def score(self, recipe, checkpoint, files, batch_size, device, load) -> dict:
        from .scoring import evaluate_replies

        return evaluate_replies(recipe, checkpoint, files, batch_size, device, load)

    def score_line(self, result: dict) -> str:
        margin = f", margin {result['rewards/margins']:.4f}" if "rewards/margins" in result else ""
        return (f"KTO loss {result['loss']:.4f}, KL {result['kl']:.4f}{margin} over {result['replies']} labelled "
                f"replies, against the reference {result['reference']}")

    def rehearse_length(self, r, shortest: int, items: int) -> int:
        from .rehearsal import shrink_length

        return shrink_length(r, shortest, items)

    def rehearsal_source(self, source, recipe):
        from .rehearsal import first_records

        return first_records(source, recipe)

    def rehearsal_notes(self, recipe) -> list:
        from .rehearsal import rehearsal_notes as notes

        return notes(recipe)


OBJECTIVE = Kto()
