"""`llama-npu eval`: mean loss per target token and perplexity of a converted checkpoint, a
step or a run directory, or a Hugging Face directory, over JSONL or JSON-array records (text,
alpaca or ShareGPT, told apart by their keys). `eval --task` (benchmark scores) is exams/.

Memory stays proportional to the records, not to --max-seq-len: records are sorted by
length, each batch is padded only to the bucket (a power of two from 64 tokens up to
--max-seq-len) that holds its longest record, so the graph compiles once per bucket used,
and the LM head with its cross-entropy (strategies/chunked_ce.py) runs one chunk of tokens
per call, so one chunk of logits exists at a time.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional


def bucket_length(longest: int, length: int, smallest: int = 64) -> int:
    """Rows of `longest` tokens padded to the next power of two >= `smallest` predicted
    tokens (+1: the model sees T+1 ids), capped at `length`."""
    bucket = smallest
    while bucket + 1 < longest:
        bucket *= 2
    return min(bucket + 1, length)


def evaluate(loss, samples, batch_size: int, length: int, bucketed: bool = False) -> tuple[float, int]:
    """Mean loss per target token over `samples`, and the number of target tokens. `loss`:
    a loss cell or a ChunkwiseLoss. Batches are padded to `length`, or with `bucketed` to
    their bucket_length."""
    from mindspore import Tensor

    from .data.samples import pad_batch
    from .model import IGNORE_ID, PAD_ID

    loss.set_train(False)
    total, tokens = 0.0, 0
    rows = max(1, min(batch_size, len(samples)))
    for start in range(0, len(samples), rows):
        chunk = list(samples[start:start + rows])
        real = len(chunk)
        chunk += [chunk[-1]] * (rows - real)  # keep one compiled shape per bucket
        padded = bucket_length(max(len(s.input_ids) for s in chunk), length) if bucketed else length
        ids, labels = pad_batch(chunk, padded, PAD_ID)
        labels[real:] = IGNORE_ID  # the repeated filler rows carry no loss
        tokens += int((labels[:, 1:] != IGNORE_ID).sum())
        total += float(loss(Tensor(ids), Tensor(labels)))
    loss.set_train(True)
    return total / max(tokens, 1), tokens


def detect_format(path: Path) -> str:
    """text / alpaca / sharegpt of an eval --data file (data/readers.detect_format), or why
    a directory is not one."""
    from .data.readers import RecordError, detect_format as record_format

    if path.is_dir():
        raise RecordError(f"--data {path}: a directory; for a C-Eval, CMMLU or MMLU directory add --task "
                          f"ceval|cmmlu|mmlu")
    return record_format(path)


DEFAULT_MAX_SEQ_LEN = 2048  # eval of a checkpoint that is not a run's (a run's is evaluated at its own)
EVAL_CHUNK = 256  # tokens of logits at a time: 256 x 128,256 fp32 is 131 MB


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
        import mindspore as ms
        from mindspore import ops

        from .model import IGNORE_ID

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


def ascend_usable() -> bool:
    """MindSpore loaded its Ascend plugin (CANN present) and sees at least one device."""
    import mindspore as ms

    try:
        return ms.device_context.ascend.is_available() and ms.device_context.ascend.device_count() > 0
    except RuntimeError:
        return False


def select_device(device: str) -> bool:
    """Set MindSpore's device for `--device auto|cpu|ascend`; True when it is Ascend."""
    import mindspore as ms

    from .recipe import RecipeError

    on_ascend = ascend_usable() if device == "auto" else device == "ascend"
    if device == "ascend" and not ascend_usable():
        raise RecipeError("--device ascend: MindSpore reports no usable Ascend device here (no CANN plugin "
                          "or no NPU); use --device cpu")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("Ascend" if on_ascend else "CPU")
    return on_ascend


def is_hf_directory(path: Path) -> bool:
    """A Hugging Face model directory (config.json with a model_type), not one of ours."""
    config = Path(path) / "config.json"
    if not config.is_file() or (Path(path) / "recipe.yaml").is_file():
        return False
    try:
        meta = json.loads(config.read_text(encoding="utf-8"))
    except ValueError:
        return False
    return isinstance(meta, dict) and "model_type" in meta and meta.get("format") != "llama-npu"


def hf_model_weights(src: Path):
    """(shape, tokenizer, name -> float32 Tensor in MindFormers' names) of a Hugging Face
    Llama 3.2 directory, read as `convert hf-to-ms` reads it, with nothing written."""
    import mindspore as ms

    from .convert import checked_hf_model
    from .weights_format import rename, to_float32

    shape, _, tensors = checked_hf_model(src)
    weights = {rename(name, to_ms=True): ms.Tensor(to_float32(stored.read(), stored.code))
               for name, stored in tensors.items()}
    tokenizer = str(src / "tokenizer.json") if (src / "tokenizer.json").is_file() else "llama3.2"
    return shape, tokenizer, weights


def checkpoint_tokenizer(checkpoint: Path) -> str:
    """The tokenizer a checkpoint eval, generate or the exam scorer takes was trained with."""
    from .pretrained import resolve_weights

    if is_hf_directory(checkpoint):
        return str(checkpoint / "tokenizer.json") if (checkpoint / "tokenizer.json").is_file() else "llama3.2"
    return resolve_weights(Path(checkpoint)).tokenizer


def build_from_checkpoint(checkpoint: Path, max_seq_len: int, batch_size: int = 1, device: str = "auto"):
    """(net, loss_cell, tokenizer name) in fp32 with the weights of `checkpoint` (a converted
    directory, a step or a run directory: pretrained.resolve_weights, or a Hugging Face
    directory) loaded, LoRA adapters folded in."""
    from .build import build_network
    from .pretrained import load_weights, model_weights, resolve_weights
    from .recipe import recipe_from_dict
    from .runtime import mute_mindformers_info

    on_ascend = select_device(device)
    if is_hf_directory(checkpoint):
        shape, tokenizer, weights = hf_model_weights(Path(checkpoint))
        weights_file = Path(checkpoint)
    else:
        source = resolve_weights(Path(checkpoint))
        shape, _, weights = model_weights(source)
        tokenizer, weights_file = source.tokenizer, source.weights
    # The tiny preset with every size overridden is exactly the checkpoint's shape.
    sizes = {"hidden_size": shape.hidden_size, "num_layers": shape.num_layers, "num_heads": shape.num_heads,
             "num_kv_heads": shape.num_kv_heads, "intermediate_size": shape.intermediate_size}
    recipe = recipe_from_dict({"model": {"preset": "tiny", **sizes},
                               "data": {"train_files": ["-"], "max_seq_len": max_seq_len},
                               "train": {"micro_batch_size": batch_size},
                               "strategies": {"chunked_ce": {"enabled": True, "chunk_size": EVAL_CHUNK}}})
    mute_mindformers_info()
    net, loss_cell = build_network(recipe, on_ascend=on_ascend, variable_length=True)
    load_weights(net, weights, shape, weights_file)
    return net, loss_cell, tokenizer


def evaluate_checkpoint(checkpoint: Path, data_files, max_seq_len: Optional[int] = None, batch_size: int = 4,
                        device: str = "auto") -> dict:
    """`max_seq_len` None: a run's checkpoint is evaluated at the run's data.max_seq_len, so its
    loss is the run's held-out loss on the same records; anything else at 2048."""
    from .data.readers import read_records
    from .data.samples import tokenize_records
    from .data.tokenizer import load_tokenizer
    from .pretrained import resolve_weights

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
    records = [r for f in data_files for r in read_records([f], detect_format(Path(f)))]
    _, loss_cell, _ = build_from_checkpoint(Path(checkpoint), max_seq_len, batch_size, device)
    samples, report = tokenize_records(tokenizer, records, max_seq_len + 1)
    samples.sort(key=lambda s: len(s.input_ids))  # batches of similar length pad little
    loss, tokens = evaluate(ChunkwiseLoss(loss_cell, EVAL_CHUNK), samples, batch_size, max_seq_len + 1, bucketed=True)
    return {"checkpoint": str(checkpoint), "records": report.read, "evaluated": report.kept,
            "truncated": report.truncated, "dropped": report.dropped_no_answer, "target_tokens": tokens,
            "loss": loss, "perplexity": math.exp(loss), "max_seq_len": max_seq_len, "max_seq_len_from": length_from}
