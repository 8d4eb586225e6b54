"""`llama-npu eval`: mean loss per target token and perplexity of a converted checkpoint
over JSONL records (text, alpaca or ShareGPT, told apart by their keys)."""
from __future__ import annotations

import json
import math
from pathlib import Path


def evaluate(loss_cell, samples, batch_size: int, length: int) -> tuple[float, int]:
    """Mean loss per target token over `samples`, and the number of target tokens."""
    from mindspore import Tensor

    from .data.samples import pad_batch
    from .model import IGNORE_ID, PAD_ID

    loss_cell.set_train(False)
    total, tokens = 0.0, 0
    for start in range(0, len(samples), batch_size):
        chunk = list(samples[start:start + batch_size])
        chunk += [chunk[-1]] * (batch_size - len(chunk))  # keep one compiled shape
        ids, labels = pad_batch(chunk, length, PAD_ID)
        labels[len(samples) - start:] = IGNORE_ID  # the repeated filler rows carry no loss
        tokens += int((labels[:, 1:] != IGNORE_ID).sum())
        total += float(loss_cell(Tensor(ids), Tensor(labels)).asnumpy())
    loss_cell.set_train(True)
    return total / max(tokens, 1), tokens


def detect_format(path: Path) -> str:
    """text / alpaca / sharegpt from the keys of the file's first record."""
    from .data.readers import RecordError, read_text

    for line in read_text(path).splitlines():
        if line.strip():
            try:
                keys = set(json.loads(line))
            except (ValueError, TypeError):
                raise RecordError(f"{path}:1: expected one JSON object per line") from None
            for fmt, key in (("text", "text"), ("alpaca", "instruction"), ("sharegpt", "conversations"),
                             ("sharegpt", "messages")):
                if key in keys:
                    return fmt
            raise RecordError(f"{path}: records have keys {sorted(keys)}; expected 'text', 'instruction', "
                              f"'conversations' or 'messages'")
    raise RecordError(f"{path}: no records (empty input)")


def build_from_checkpoint(checkpoint: Path, max_seq_len: int, batch_size: int = 1):
    """(net, loss_cell) on the CPU backend with a converted checkpoint's weights loaded."""
    import mindspore as ms

    from .build import build_network
    from .convert import read_checkpoint_dir
    from .recipe import recipe_from_dict
    from .runtime import mute_mindformers_info

    shape, _ = read_checkpoint_dir(checkpoint)
    # The tiny preset with every size overridden is exactly the checkpoint's shape.
    sizes = {"hidden_size": shape.hidden_size, "num_layers": shape.num_layers, "num_heads": shape.num_heads,
             "num_kv_heads": shape.num_kv_heads, "intermediate_size": shape.intermediate_size}
    recipe = recipe_from_dict({"model": {"preset": "tiny", "checkpoint": str(checkpoint), **sizes},
                               "data": {"train_files": ["-"], "max_seq_len": max_seq_len},
                               "train": {"micro_batch_size": batch_size}})
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    mute_mindformers_info()
    return build_network(recipe, on_ascend=False)


def evaluate_checkpoint(checkpoint: Path, data_files, max_seq_len: int = 2048, batch_size: int = 4,
                        tokenizer: str = "llama3.2") -> dict:
    from .data.readers import read_records
    from .data.samples import tokenize_records
    from .data.tokenizer import load_tokenizer

    records = [r for f in data_files for r in read_records([f], detect_format(Path(f)))]
    samples, report = tokenize_records(load_tokenizer(tokenizer), records, max_seq_len + 1)
    _, loss_cell = build_from_checkpoint(Path(checkpoint), max_seq_len, batch_size)
    loss, tokens = evaluate(loss_cell, samples, batch_size, max_seq_len + 1)
    return {"checkpoint": str(checkpoint), "records": report.read, "evaluated": report.kept,
            "truncated": report.truncated, "dropped": report.dropped_no_answer, "target_tokens": tokens,
            "loss": loss, "perplexity": math.exp(loss)}
