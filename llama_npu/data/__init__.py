"""Data: readers, the Llama 3 chat template, tokenization and the training batch stream."""
