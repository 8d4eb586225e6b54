"""`llama-npu eval`: mean loss per target token and perplexity of a converted checkpoint, a
step or a run directory, or a Hugging Face directory, over JSONL, JSON-array, CSV, TSV, .xlsx
or Parquet records (text, alpaca or ShareGPT, told apart by their keys; a run's own
data.columns and data.encoding read them). `eval --task` (benchmark scores) is exams/.

Memory stays proportional to the records, not to --max-seq-len: records are sorted by
length, each batch is padded only to the bucket (a power of two from 64 tokens up to
--max-seq-len) that holds its longest record, so the graph compiles once per bucket used,
and the LM head with its cross-entropy (model/chunked_loss.py) runs one chunk of tokens
per call, so one chunk of logits exists at a time.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

from ..data.readers import RecordError, detect_format as record_format
from ..data.tables import ReadOptions
from ..data.tokenizer import load_tokenizer
from ..objectives import records_of, sft
from .loaded_model import EVAL_CHUNK, build_from_checkpoint, select_device
from .loss_loop import evaluate


def detect_format(path: Path, options: ReadOptions = ReadOptions()) -> str:
    """text / alpaca / sharegpt of an eval --data file (data/readers.detect_format), or why
    a directory is not one."""

    if path.is_dir():
        raise RecordError(f"--data {path}: a directory; for a C-Eval, CMMLU or MMLU directory add --task "
                          f"ceval|cmmlu|mmlu")
    return record_format(path, options)


def read_eval_records(data_files, reading: ReadOptions, on_bad_record: str = "error") -> list:
    """The records of eval --data's files, each in the format its keys give, read by train's
    readers with the run's data.columns and data.encoding (`reading`); a bad record stops
    the read (error) or is counted and named (skip)."""
    for path in data_files:
        detect_format(Path(path), reading)  # a directory is refused, naming --task
    # imported here: data.source imports numpy, and `llama-npu doctor` must start (and say the
    # environment is broken) where numpy does not import
    from ..data.source import read_files

    return read_files(data_files, reading, on_bad_record, records_of(sft.OBJECTIVE))  # pairs refused by name


DEFAULT_MAX_SEQ_LEN = 2048  # eval of a checkpoint that is not a run's (a run's is evaluated at its own)


class ChunkwiseLoss:
    """A loss cell's (ids, labels) -> summed loss, with its backbone run as one graph and
    its chunked head+loss called once a chunk. Inside one graph the CPU backend does not
    reuse buffers (FACTS.md), so chunks unrolled in a graph would all hold their logits;
    across calls, at most one chunk's exist on any backend. The last chunk is padded with
    ignored targets, so the head compiles once."""

    def __init__(self, loss_cell, chunk: int):
        self.loss_cell, self.chunk = loss_cell, chunk

    def set_train(self, mode: bool) -> None:
        self.loss_cell.set_train(mode)

    def __call__(self, ids, labels):
        import mindspore as ms  # imported here: --help imports this module; MindSpore and numpy, only to evaluate
        from mindspore import ops

        from ..model.tokens import IGNORE_ID

        hidden = self.loss_cell.backbone(ids[:, :-1])  # (B, T, H)
        hidden = hidden.reshape(-1, hidden.shape[-1])  # (B*T, H)
        targets = labels[:, 1:].reshape(-1)
        pad = -hidden.shape[0] % self.chunk
        if pad:
            hidden = ops.concat((hidden, ops.zeros((pad, hidden.shape[1]), hidden.dtype)))
            targets = ops.concat((targets, ops.full((pad,), IGNORE_ID, dtype=ms.int32)))
        total = 0.0
        for start in range(0, hidden.shape[0], self.chunk):
            total += float(self.loss_cell.head_loss(hidden[start:start + self.chunk],
                                                    targets[start:start + self.chunk]).asnumpy())
        return total


def evaluate_checkpoint(checkpoint: Path, data_files, max_seq_len: Optional[int] = None, batch_size: int = 4,
                        device: str = "auto", weights: str = "stored", on_bad_record: str = "error") -> dict:
    """`max_seq_len` None: a run's checkpoint is evaluated at the run's data.max_seq_len, so its
    loss is the run's held-out loss on the same records; anything else at 2048."""
    from ..data.samples import tokenize_records  # imported here: --help imports this module; numpy, only to evaluate
    from ..weights.pretrained import resolve_weights

    # The device, the tokenizer and the data are checked before the model is built.
    select_device(device)
    source = resolve_weights(Path(checkpoint))
    if max_seq_len is not None:
        length_from = "--max-seq-len"
    elif source.max_seq_len is not None:
        max_seq_len, length_from = source.max_seq_len, "the run's data.max_seq_len"
    else:
        max_seq_len, length_from = DEFAULT_MAX_SEQ_LEN, "the default"
    tokenizer = load_tokenizer(source.tokenizer)
    records = read_eval_records(data_files, source.reading, on_bad_record)
    _, loss_cell, _ = build_from_checkpoint(Path(checkpoint), max_seq_len, batch_size, device, weights)
    samples, report = tokenize_records(tokenizer, records, max_seq_len + 1, truncation=source.truncation)
    samples.sort(key=lambda s: len(s.input_ids))  # batches of similar length pad little
    loss, tokens = evaluate(ChunkwiseLoss(loss_cell, EVAL_CHUNK), samples, batch_size, max_seq_len + 1, bucketed=True)
    return {"checkpoint": str(checkpoint), "records": report.read, "evaluated": report.kept,
            "truncated": report.truncated, "dropped": report.dropped, "target_tokens": tokens,
            "loss": loss, "perplexity": math.exp(loss), "max_seq_len": max_seq_len, "max_seq_len_from": length_from,
            "weights": weights}
