"""lm-eval's model interface (lm_eval.api.model.TemplateLM) over our MindSpore Llama, so its
task definitions, prompts and metrics run unchanged on MindSpore, on the CPU or on Ascend.

Scoring (`_loglikelihood_tokens`), as `llama-npu eval` batches:
- each request is one input row, (context + continuation)[:-1], cut from the left to
  --max-seq-len; requests with the same input share one row, so the four one-token choices
  A-D of a question cost one forward pass of the backbone;
- rows are sorted by length and batched --batch-size at a time, each batch padded only to
  the power-of-two bucket of its longest row (evaluate.bucket_length), so the graph
  compiles once per bucket;
- the LM head runs only at the positions that predict a continuation token, EVAL_CHUNK
  positions per call, each position scoring up to TARGETS tokens: one chunk of logits exists
  at a time, and the fp32 log-softmax never leaves the device.
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

import numpy as np
from lm_eval import utils
from lm_eval.api.model import TemplateLM

from ...common.console import progress_bar
from ...data.chat_template import render_text
from ...model.tokens import BOS_ID, EOT_ID, PAD_ID
from ...weights.hf_export import CHAT_TEMPLATE
from ..generate import decode
from ..loaded_model import EVAL_CHUNK
from ..loss_loop import bucket_length

TARGETS = 4  # continuation tokens scored per head position: the four choices of a question
# The markers lm-eval's chat prompts contain, written by apply_chat_template below. The
# tokenizer reads special-token text in data as plain text (data/tokenizer.py), so these are
# mapped to their ids here and only here.
MARKER_TOKENS = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
CHAT_MARKERS = re.compile("(" + "|".join(map(re.escape, MARKER_TOKENS)) + ")")


def head_rows(needed: int) -> int:
    """Rows of one head call: a power of two from 8 to EVAL_CHUNK, so a batch of four
    one-token questions computes 8 rows of logits, not EVAL_CHUNK, and the head compiles
    for at most six shapes."""
    rows = 8
    while rows < needed:
        rows *= 2
    return min(rows, EVAL_CHUNK)


def target_head(lm_head):
    """A cell: (hidden (C, H), targets (C, K)) -> (log p of each target (C, K), argmax (C,))."""
    import mindspore as ms  # imported here: MindSpore loads after the command's quiet_frameworks (common/frameworks.py)
    from mindspore import nn, ops

    class TargetLogprobs(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.head = lm_head

        def construct(self, hidden, targets):
            logits = self.head(hidden).astype(ms.float32)  # (C, V)
            logp = ops.log_softmax(logits, -1)
            return ops.gather_elements(logp, 1, targets), ops.argmax(logits, -1)

    cell = TargetLogprobs()
    cell.set_train(False)
    return cell


class MindSporeLM(TemplateLM):
    def __init__(self, net, tokenizer, max_seq_len: int, batch_size: int, progress: bool = True):
        super().__init__()
        self.net, self.tokenizer = net, tokenizer
        self.max_seq_len, self.batch_size, self.progress = max_seq_len, batch_size, progress
        self.backbone = net.model
        self.backbone.set_train(False)
        self.head = target_head(net.lm_head)
        self.markers = {m: tokenizer.token_to_id(m) for m in MARKER_TOKENS}
        # (context, continuation) -> (the context ids scored, after any cut; continuation ids)
        self.encoded: Dict[Tuple[str, str], Tuple[List[int], List[int]]] = {}

    # ------------------------------------------------------------ tokens
    @property
    def eot_token_id(self) -> int:
        return EOT_ID

    @property
    def prefix_token_id(self) -> int:
        return BOS_ID  # an empty context conditions on <|begin_of_text|>, as Llama 3 was trained

    @property
    def max_length(self) -> int:
        return self.max_seq_len

    def tok_encode(self, string: str, add_special_tokens: Optional[bool] = None, **kwargs) -> List[int]:
        """Llama 3's tokenizer adds <|begin_of_text|> (as lm-eval's HFLM leaves it to), unless
        the string already starts with it (a chat prompt) or add_special_tokens is False."""
        ids: List[int] = []
        for piece in CHAT_MARKERS.split(string):
            if piece in self.markers:
                ids.append(self.markers[piece])
            elif piece:
                ids += self.tokenizer.encode(piece, add_special_tokens=False).ids
        if add_special_tokens is not False and ids[:1] != [BOS_ID]:
            ids = [BOS_ID] + ids
        return ids

    def tok_decode(self, ids: List[int]) -> str:
        return self.tokenizer.decode(ids)

    # ------------------------------------------------------------ chat
    @property
    def tokenizer_name(self) -> str:
        return "llama-npu-llama3-chat"

    def chat_template(self, chat_template=False) -> str:
        return CHAT_TEMPLATE

    def apply_chat_template(self, chat_history: List[dict], add_generation_prompt: bool = True) -> str:
        """The conversation in the format the harness trains with (data/chat_template.py)."""
        text = render_text([(m["role"], m["content"]) for m in chat_history])
        return text + ("<|start_header_id|>assistant<|end_header_id|>\n\n" if add_generation_prompt else "")

    # ------------------------------------------------------------ scoring
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> List[Tuple[float, bool]]:
        # imported here: MindSpore loads after the command's quiet_frameworks (common/frameworks.py)
        import mindspore as ms
        from mindspore import ops

        rows: Dict[tuple, List[Tuple[int, int, List[int]]]] = {}  # input ids -> (request, first position, targets)
        for index, (key, context, continuation) in enumerate(requests):
            whole = (list(context) + list(continuation))[-(self.max_seq_len + 1):]
            inputs = tuple(whole[:-1])
            first = len(inputs) - len(continuation)  # the position whose output predicts continuation[0]
            rows.setdefault(inputs, []).append((index, first, list(continuation)))
            if key is not None:
                self.encoded[key] = (list(inputs[:first + 1]), list(continuation))
        logprob = [0.0] * len(requests)
        greedy = [True] * len(requests)
        order = sorted(rows, key=len)
        with progress_bar(len(order), "scoring", "prompt", enabled=self.progress and not disable_tqdm) as bar:
            for start in range(0, len(order), self.batch_size):
                batch = order[start:start + self.batch_size]
                width = bucket_length(max(len(r) for r in batch), self.max_seq_len)
                ids = np.full((self.batch_size, width), PAD_ID, dtype=np.int32)
                for b, row in enumerate(batch + [batch[-1]] * (self.batch_size - len(batch))):  # one shape a bucket
                    ids[b, :len(row)] = row
                hidden = self.backbone(ms.Tensor(ids))  # (B, W, H)
                hidden = hidden.reshape(-1, hidden.shape[-1])  # (B*W, H)
                # One slot per (row position, up to TARGETS tokens it must score).
                slots: Dict[int, List[Tuple[int, int]]] = {}
                for b, row in enumerate(batch):
                    for index, first, targets in rows[row]:
                        for offset, token in enumerate(targets):
                            slots.setdefault(b * width + first + offset, []).append((index, token))
                flat, slot_targets, owners = [], [], []
                for position, wanted in slots.items():
                    for i in range(0, len(wanted), TARGETS):
                        group = wanted[i:i + TARGETS]
                        flat.append(position)
                        slot_targets.append([t for _, t in group] + [0] * (TARGETS - len(group)))
                        owners.append(group)
                for c in range(0, len(flat), EVAL_CHUNK):
                    positions = flat[c:c + EVAL_CHUNK]
                    pad = head_rows(len(positions)) - len(positions)
                    chunk = ops.gather(hidden, ms.Tensor(positions + [0] * pad, ms.int32), 0)  # (C, H)
                    targets = np.array(slot_targets[c:c + EVAL_CHUNK] + [[0] * TARGETS] * pad, dtype=np.int32)
                    picked, best = self.head(chunk, ms.Tensor(targets))
                    picked, best = picked.asnumpy(), best.asnumpy()
                    for s, group in enumerate(owners[c:c + EVAL_CHUNK]):
                        for k, (index, token) in enumerate(group):
                            logprob[index] += float(picked[s, k])
                            greedy[index] = greedy[index] and int(best[s]) == token
                bar.update(len(batch))
        return list(zip(logprob, greedy))

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> List[float]:
        """Each string's total log-likelihood in disjoint windows of --max-seq-len, as
        lm-eval's HFLM computes it (lm_eval/models/huggingface.py loglikelihood_rolling)."""
        windows, owner = [], []
        for index, (string,) in enumerate(req.args for req in requests):
            for context, continuation in map(utils.make_disjoint_window, utils.get_rolling_token_windows(
                    token_list=self.tok_encode(string, add_special_tokens=False), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_seq_len, context_len=1)):
                windows.append((None, context, continuation))
                owner.append(index)
        totals = [0.0] * len(requests)
        for index, (value, _) in zip(owner, self._loglikelihood_tokens(windows, disable_tqdm)):
            totals[index] += value
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> List[str]:
        """Greedy replies through `llama-npu generate`'s decoder, cut at the first `until` string."""

        replies = []
        for context, gen_kwargs in (req.args for req in requests):
            until = gen_kwargs.get("until") or [self.tok_decode([EOT_ID])]
            until = [until] if isinstance(until, str) else list(until)
            new_tokens = int(gen_kwargs.get("max_gen_toks", 256))
            ids = self.tok_encode(context)[-max(self.max_seq_len - new_tokens, 1):]
            generated = decode(self.net, self.tokenizer, ids, new_tokens,
                               stop=lambda text: any(u in text for u in until))
            text = self.tok_decode(generated)
            for u in until:
                text = text.split(u)[0]
            replies.append(text)
        return replies
