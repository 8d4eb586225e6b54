"""lm-eval's model interface (lm_eval.api.model.TemplateLM) over our MindSpore Llama, so its
task definitions, prompts and metrics run unchanged on MindSpore, on the CPU or on Ascend.

Scoring (`_loglikelihood_tokens`), as `llama-npu eval` batches:
- each request is one input row, (context + continuation)[:-1], cut from the left to
  --max-seq-len; requests with the same input share one row, so the four one-token choices
  A-D of a question cost one forward pass of the backbone;
- rows are sorted by length, longest first (the first batch sizes the memory the others
  reuse), and batched --batch-size at a time. Each batch is padded to one of a few widths
  (plan_widths): the power-of-two buckets of their longest rows (loss_loop.bucket_length),
  merged upward where the padding costs less than the compile it saves, a graph a width. On
  the CPU, where that costs more (dynamic_cheaper), the backbone and the head are each one
  graph of dynamic shape instead (Cell.set_inputs, mindspore/nn/cell.py: a None dimension),
  each batch padded only to its own longest row; an exam of at most EAGER_BATCHES batches
  compiles nothing and runs op by op. Ascend keeps the widths (its 910A default, the O2 graph
  sink, is not checked here with dynamic shapes). compile_cache.py keeps the graphs for the
  next run of the same shapes;
- the LM head runs only at the positions that predict a continuation token, EVAL_CHUNK
  positions per call, each position scoring up to TARGETS tokens: one chunk of logits exists
  at a time, and the fp32 log-softmax never leaves the device;
- --compare loads the second checkpoint's weights into the same network
  (loaded_model.reload_weights): its questions run through the graphs already compiled.
"""
from __future__ import annotations

import json
import re
import time
from contextlib import contextmanager
from typing import Dict, List, Optional, Sequence, Tuple

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
# One more backbone graph costs about a forward over this many padded tokens: measured on
# this 2-core CPU for the hidden-256, 4-layer model of benchmarks/exam_throughput.py at a load
# under 1 (a compile 1.5-1.9 s, a padded token 0.1 ms at 129 wide to 0.2 ms at 513). On a card
# compute is faster and compiles slower, which only makes merging widths the better choice there.
COMPILE_TOKENS = 10240
# The backbone's graph of dynamic shape compiles in about twice that (2.8 s against 1.5 s, the
# same measurement; 4.1 against 2.3 at a load of 4-8).
DYNAMIC_COMPILE_TOKENS = 2 * COMPILE_TOKENS
# Exams of at most this many batches run op by op (PyNative), nothing compiled: measured on
# this 2-core CPU (hidden-256, 4-layer model, batch 8, /tmp profile of 2026-12-03 at load 5-8):
# a batch costs 0.45-0.65 s more eager than through a graph (0.6 vs 0.15 s at 70 tokens,
# 1.2 vs 0.55 s at 300), and the two dynamic-shape graphs cost 2.2-3 s to compile: break-even
# at 3.5-6 batches.
EAGER_BATCHES = 4
# The markers lm-eval's chat prompts contain, written by apply_chat_template below. The
# tokenizer reads special-token text in data as plain text (data/tokenizer.py), so these are
# mapped to their ids here and only here.
MARKER_TOKENS = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
CHAT_MARKERS = re.compile("(" + "|".join(map(re.escape, MARKER_TOKENS)) + ")")


def plan_widths(lengths: Sequence[int], batch_size: int, max_len: int) -> List[int]:
    """The widths the backbone compiles for rows of `lengths`, batched `batch_size` at a
    time, longest first: each batch's bucket_length, with neighbouring buckets merged
    into the wider one wherever the padding added (batches x batch_size x extra width) costs
    fewer tokens than the COMPILE_TOKENS a graph costs (an exact search over the buckets)."""
    ordered = sorted(lengths, reverse=True)
    needs = [bucket_length(ordered[i], max_len) for i in range(0, len(ordered), batch_size)]
    buckets = sorted(set(needs))
    count = [needs.count(b) for b in buckets]
    # best[j]: the least cost of buckets[:j], its last group ending at bucket j - 1
    best, cut = [0.0] + [float("inf")] * len(buckets), [0] * (len(buckets) + 1)
    for j in range(1, len(buckets) + 1):
        for i in range(j):
            cost = best[i] + COMPILE_TOKENS + batch_size * buckets[j - 1] * sum(count[i:j])
            if cost < best[j]:
                best[j], cut[j] = cost, i
    widths, j = [], len(buckets)
    while j:
        widths.append(buckets[j - 1])
        j = cut[j]
    return sorted(widths)


def dynamic_shapes() -> bool:
    """Whether the scorer may compile one graph of dynamic shape for all widths, or run op by
    op: on the CPU, where MindSpore 2.9 runs it kernel by kernel (checked: one compile, no
    recompile at a new width); not on Ascend, unchecked here (its 910A default, the O2 graph
    sink, wants static shapes)."""
    import mindspore as ms  # imported here: MindSpore loads after the command's quiet_frameworks (common/frameworks.py)

    return ms.get_context("device_target") == "CPU"


@contextmanager
def run_mode(eager: bool):
    """PyNative (op by op) inside with `eager`, graph mode again after it."""
    import mindspore as ms  # imported here: MindSpore loads after the command's quiet_frameworks (common/frameworks.py)

    if not eager:
        yield
        return
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        yield
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)


def dynamic_cheaper(lengths: Sequence[int], batch_size: int, max_len: int) -> bool:
    """Whether one backbone graph of dynamic shape, each batch at its own longest row, costs
    less than plan_widths' graph a width, each batch padded to its width: the compiles counted
    in (DYNAMIC_)COMPILE_TOKENS, the batches in their padded tokens. A small 0-shot exam,
    whose rows all fit one short bucket, compiles one static shape."""
    widths = plan_widths(lengths, batch_size, max_len)
    longest = sorted(lengths, reverse=True)[::batch_size]
    static = COMPILE_TOKENS * len(widths) + batch_size * sum(next(w for w in widths if w >= n) for n in longest)
    return DYNAMIC_COMPILE_TOKENS + batch_size * sum(longest) < static


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
        self.may_vary = dynamic_shapes()  # dynamic shapes and op-by-op runs are options (on the CPU)
        self.dynamic: Optional[bool] = None if self.may_vary else False  # chosen at the first call where None
        self.widths: List[int] = []  # the backbone's padded widths (plan_widths), without dynamic shapes
        self.compiled: set = set()  # ("backbone", width) / ("head", rows) already compiled; None: any
        self.compile_seconds = 0.0  # spent compiling them (or loading them from the compile cache)
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

    def use_checkpoint(self, tokenizer) -> None:
        """Score with the weights now in self.net (loaded_model.reload_weights) and `tokenizer`:
        the compiled graphs stay."""
        self.tokenizer = tokenizer
        self.markers = {m: tokenizer.token_to_id(m) for m in MARKER_TOKENS}
        self.encoded = {}

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
        order = sorted(rows, key=len, reverse=True)
        if self.dynamic is None:
            self.dynamic = dynamic_cheaper([len(r) for r in order], self.batch_size, self.max_seq_len)
        if not self.dynamic:
            self._plan_widths([len(r) for r in order])
        batches = []  # (rows, width, [(positions, targets (C, TARGETS), owners)] a head call)
        for start in range(0, len(order), self.batch_size):
            batch = order[start:start + self.batch_size]
            width = len(batch[0]) if self.dynamic else next(w for w in self.widths if w >= len(batch[0]))
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
            calls = []
            for c in range(0, len(flat), EVAL_CHUNK):
                rows_here = len(flat[c:c + EVAL_CHUNK])
                pad = 0 if self.dynamic else head_rows(rows_here) - rows_here
                calls.append((flat[c:c + EVAL_CHUNK] + [0] * pad, slot_targets[c:c + EVAL_CHUNK] + [[0] * TARGETS] * pad,
                              owners[c:c + EVAL_CHUNK]))
            batches.append((batch, width, calls))
        graphs = [("backbone", None), ("head", None)] if self.dynamic else \
            [("backbone", w) for w in sorted({w for _, w, _ in batches})] + \
            [("head", n) for n in sorted({len(p) for *_, calls in batches for p, _, _ in calls})]
        eager = self._eager_is_cheaper(len(batches), graphs)
        if not eager:
            self._compile(graphs)
        logprob = [0.0] * len(requests)
        greedy = [True] * len(requests)
        with progress_bar(len(order), "scoring", "prompt", enabled=self.progress and not disable_tqdm) as bar, \
                run_mode(eager):
            for batch, width, calls in batches:
                ids = np.full((self.batch_size, width), PAD_ID, dtype=np.int32)
                for b, row in enumerate(batch + [batch[-1]] * (self.batch_size - len(batch))):  # one shape a width
                    ids[b, :len(row)] = row
                hidden = self.backbone(ms.Tensor(ids))  # (B, W, H)
                hidden = hidden.reshape(-1, hidden.shape[-1])  # (B*W, H)
                for positions, targets, owners in calls:
                    chunk = ops.gather(hidden, ms.Tensor(positions, ms.int32), 0)  # (C, H)
                    picked, best = self.head(chunk, ms.Tensor(np.array(targets, dtype=np.int32)))
                    picked, best = picked.asnumpy(), best.asnumpy()
                    for s, group in enumerate(owners):
                        for k, (index, token) in enumerate(group):
                            logprob[index] += float(picked[s, k])
                            greedy[index] = greedy[index] and int(best[s]) == token
                bar.update(len(batch))
        return list(zip(logprob, greedy))

    def _eager_is_cheaper(self, batches: int, graphs: List[tuple]) -> bool:
        """Whether to run `batches` op by op (PyNative: nothing compiled) rather than compile
        `graphs`: on the CPU, for at most EAGER_BATCHES, when no graph is compiled yet and the
        compile cache does not hold them (it hands them back in less time than an eager run)."""
        from .. import compile_cache

        if not self.may_vary or self.compiled or batches > EAGER_BATCHES:
            return False
        return not compile_cache.holds(self._cache_key(graphs))

    def _plan_widths(self, lengths: List[int]) -> None:
        """The widths this scorer pads to: planned on the first call, widened only when a later
        call (--compare's second model, a rolling window) has longer rows."""
        wanted = plan_widths(lengths, self.batch_size, self.max_seq_len)
        if not self.widths:
            self.widths = wanted
        elif lengths and max(lengths) > self.widths[-1]:
            self.widths = sorted(set(self.widths) | {w for w in wanted if w > self.widths[-1]})

    def _cache_key(self, graphs: List[tuple]) -> dict:
        """What decides the graphs' shapes: the model's config and parameters (not their
        values), the batch size and the graphs in their order of compile."""
        return {"config": json.dumps(self.net.config.to_dict(), sort_keys=True, default=str),
                "parameters": [[p.name, list(p.shape), str(p.dtype)] for p in self.net.get_parameters()],
                "batch": self.batch_size, "graphs": graphs}

    def _compile(self, graphs: List[tuple]) -> None:
        """Compile the graphs ((kind, size): size None is the one graph of dynamic shape) not
        compiled yet, in the given order (the same shapes in the same order in every run), so
        that MindSpore's compile cache (compile_cache.py) can hand them back; graphs a later
        call adds compile outside the cache."""
        import mindspore as ms  # imported here: MindSpore loads after the command's quiet_frameworks

        from .. import compile_cache

        todo = [graph for graph in graphs if graph not in self.compiled]
        if not todo:
            return
        if self.compiled:
            compile_cache.disable()
        else:
            compile_cache.enable(self._cache_key(todo))
        hidden_size = self.net.config.hidden_size
        started = time.perf_counter()
        for kind, size in todo:
            if kind == "backbone":
                ids = ms.Tensor(shape=[self.batch_size, None], dtype=ms.int32) if size is None else \
                    ms.Tensor(np.zeros((self.batch_size, size), np.int32))
                self.backbone.set_inputs(ids)
                self.backbone.compile(ids)
            else:
                inputs = (ms.Tensor(shape=[None, hidden_size], dtype=ms.float32),
                          ms.Tensor(shape=[None, TARGETS], dtype=ms.int32)) if size is None else \
                    (ms.Tensor(np.zeros((size, hidden_size), np.float32)), ms.Tensor(np.zeros((size, TARGETS), np.int32)))
                self.head.set_inputs(*inputs)
                self.head.compile(*inputs)
            self.compiled.add((kind, size))
        self.compile_seconds += time.perf_counter() - started

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
