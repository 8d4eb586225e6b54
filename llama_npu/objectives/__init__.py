"""Training objectives other than next-token cross-entropy, beside the strategies: what a
step's loss is, whereas a strategy changes how the same loss is computed. `train.objective`
picks one (sft: model/loss.py; dpo: preference.py, its recipe section `dpo:`).

preference (the `dpo:` section and its checks; pure Python), preference_loss (TRL's
formulas in MindSpore ops), sequence_logps (per-sequence log-probs, full or chunked head)."""
