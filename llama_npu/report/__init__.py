"""Runs and plans to look at: a run's history (history.jsonl), the series its metrics.jsonl
holds (series.py), its pictures in RUN/images/ (pictures.py, drawn in a child process at each
checkpoint: journal.py), the loss as a sparkline (sparkline.py), one HTML page comparing runs
(page.py, `llama-npu report`) and plan's memory as a picture (plan_picture.py, `plan --plot`).

Everything here reads a run's files and never changes them, except journal.py, which writes
history.jsonl and images/ for the run that is training."""
