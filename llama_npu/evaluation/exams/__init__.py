"""Multiple-choice benchmarks (C-Eval, CMMLU, MMLU) from local CSV files, scored with
lm-eval's task definitions through our MindSpore model."""
