"""The held-out loss loop: mean loss per target token over samples, used by training's
periodic evaluation and by `llama-npu eval`."""
from __future__ import annotations

from ..model.tokens import IGNORE_ID, PAD_ID


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
    from mindspore import Tensor  # imported here: --help imports this module; MindSpore and numpy, only to evaluate

    from ..data.samples import pad_batch

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
