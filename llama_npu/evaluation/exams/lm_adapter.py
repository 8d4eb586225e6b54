"""lm-eval's model interface (lm_eval.api.model.TemplateLM) over our MindSpore Llama, so its
task definitions, prompts and metrics run unchanged on MindSpore, on the CPU or on Ascend.

Scoring (`_loglikelihood_tokens`), as `llama-npu eval` batches:
- each request is one input row, (context + continuation)[:-1], cut from the left to
  --max-seq-len; requests with the same input share one row, so the four one-token choices
  A-D of a question cost one forward pass of the backbone;
- rows that share a prefix (a subject's description and shots) are packed under one copy
  of it (shared_prefix.py: every row keeps its own positions and sees only the prefix and
  itself), in packs of the width whose multiply-adds, attention included, are fewest
  (choose_cap), so a few-shot exam computes its shots once a pack, not once a question;
- packs are sorted by length, longest first (the first batch sizes the memory the others
  reuse), and batched --batch-size at a time, run as scoring_plan.py chooses (eval's
  --execution auto): op by op (nothing compiled), through a graph a padded width (the
  power-of-two buckets of the longest packs, merged where padding costs less time than a
  compile; Ascend's only way), or through one graph of dynamic shape (Cell.set_inputs,
  mindspore/nn/cell.py: a None dimension): whichever the host's measured rates say is
  fastest, compiles included. compile_cache.py keeps the graphs for the next run of the
  same shapes;
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
from typing import Dict, List, Optional, Tuple

import numpy as np
from lm_eval import utils
from lm_eval.api.model import TemplateLM

from ...common.console import progress_bar
from ...data.readers import RecordError
from ...data.chat_template import render_text
from ...model.tokens import BOS_ID, EOT_ID, PAD_ID
from ...weights.hf_export import CHAT_TEMPLATE
from .. import compile_cache
from ..generate import decode
from ..loaded_model import EVAL_CHUNK
from .scoring_plan import Plan, Rates, backbone_costs, batches_of, choose
from .shared_prefix import PAD_SEGMENT

TARGETS = 4  # continuation tokens scored per head position: the four choices of a question
# The markers lm-eval's chat prompts contain, written by apply_chat_template below. The
# tokenizer reads special-token text in data as plain text (data/tokenizer.py), so these are
# mapped to their ids here and only here.
MARKER_TOKENS = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
CHAT_MARKERS = re.compile("(" + "|".join(map(re.escape, MARKER_TOKENS)) + ")")


def dynamic_shapes() -> bool:
    """Whether the scorer may compile one graph of dynamic shape for all widths, or run op by
    op: on the CPU, where MindSpore 2.9 runs it kernel by kernel (checked: one compile, no
    recompile at a new width); not on Ascend, unchecked here (its 910A default, the O2 graph
    sink, wants static shapes)."""
    import mindspore as ms  # imported here: MindSpore loads after the command's quiet_frameworks (common/frameworks.py)

    return ms.get_context("device_target") == "CPU"


@contextmanager
def run_mode(eager: bool):
    """PyNative (op by op) inside with `eager`, graph mode again after it. Its ops run
    synchronously: on 2 cores, 15% faster than with a dispatch thread beside the kernels'
    (8 x 128 tokens: 0.155 against 0.186 s a batch, scoring_plan.py's host)."""
    import mindspore as ms  # imported here: MindSpore loads after the command's quiet_frameworks (common/frameworks.py)

    if not eager:
        yield
        return
    ms.set_context(mode=ms.PYNATIVE_MODE, pynative_synchronize=True)
    try:
        yield
    finally:
        ms.set_context(mode=ms.GRAPH_MODE, pynative_synchronize=False)


def head_rows(needed: int) -> int:
    """Rows of the head's graph: a power of two from 8 to EVAL_CHUNK, enough for the most
    positions a batch scores, so a batch of four one-token questions computes 8 rows of
    logits, not EVAL_CHUNK."""
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


def shared_prefix_backbone(backbone, flash_attention: bool):
    """A cell: (ids, positions, segments), each (B, W) int32 (shared_prefix.py's packs) ->
    hidden (B, W, H): LlamaModel's layers with each token at its own row's position and
    attending only to the earlier tokens of the prefix and of its own segment (the mask
    shared_prefix.segment_mask describes), additive or, for flash attention, uint8."""
    import mindspore as ms  # imported here: MindSpore loads after the command's quiet_frameworks (common/frameworks.py)
    from mindspore import nn, ops

    from ...model.loss import rotary_at, run_layers

    class SharedPrefixBackbone(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.backbone = backbone

        def construct(self, ids, positions, segments):
            bs, width = ids.shape
            keys = segments.reshape(bs, 1, width)
            visible = ops.logical_or(segments.reshape(bs, width, 1) == keys, keys == 0)
            order = ops.arange(0, width, 1, dtype=ms.int32)
            causal = order.reshape(1, width, 1) >= order.reshape(1, 1, width)
            blocked = 1 - ops.logical_and(visible, causal).astype(ms.float32)  # (B, W, W), 1 = masked
            if flash_attention:
                mask = blocked.reshape(bs, 1, width, width).astype(ms.uint8)
            else:
                mask = (blocked * -10000.0).reshape(bs, 1, width, width).astype(self.backbone.dtype)
            return run_layers(self.backbone, ids, mask, freqs=rotary_at(self.backbone, positions))

    cell = SharedPrefixBackbone()
    cell.set_train(False)
    return cell


class MindSporeLM(TemplateLM):
    def __init__(self, net, tokenizer, max_seq_len: int, batch_size: int, progress: bool = True,
                 execution: str = "auto"):
        super().__init__()
        self.net, self.tokenizer = net, tokenizer
        self.max_seq_len, self.batch_size, self.progress = max_seq_len, batch_size, progress
        self.backbone = shared_prefix_backbone(net.model, net.config.use_flash_attention)
        token_macs, pair_macs = backbone_costs(net.config)
        self.rates = Rates(token_macs, pair_macs, net.config.num_layers, on_ascend=not dynamic_shapes())
        self.head = target_head(net.lm_head)
        self.markers = {m: tokenizer.token_to_id(m) for m in MARKER_TOKENS}
        self.may_vary = dynamic_shapes()  # dynamic shapes and op-by-op runs are options (on the CPU)
        if execution in ("eager", "dynamic") and not self.may_vary:
            raise RecordError(f"--execution {execution}: the CPU's only; on Ascend the exam runs through a graph a "
                              f"padded width (--execution static, or auto)")
        self.execution = None if execution == "auto" else execution
        self.mode: Optional[str] = None  # "static" or "dynamic": the graphs compiled; None: none yet
        self.widths: List[int] = []  # the static graphs' widths
        self.head_size = 0  # the static head graph's rows (head_rows)
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
        plan = choose(list(rows), self.batch_size, self.max_seq_len, self.rates, self.may_vary, self.mode,
                      self.widths, cached=lambda option: bool(compile_cache.holds(self._cache_key(
                          self._graphs(option, self._layout(option, rows))))), forced=self.execution)
        batches = self._layout(plan, rows)
        eager = plan.mode == "eager"
        if not eager:
            self._compile(plan, self._graphs(plan, batches))
        logprob = [0.0] * len(requests)
        greedy = [True] * len(requests)
        with progress_bar(len(rows), "scoring", "prompt", enabled=self.progress and not disable_tqdm) as bar, \
                run_mode(eager):
            for batch, width, calls in batches:
                # Graphs take one shape a width: the batch filled with copies of its last pack.
                filled = batch if eager else batch + [batch[-1]] * (self.batch_size - len(batch))
                ids = np.full((len(filled), width), PAD_ID, dtype=np.int32)
                positions = np.zeros((len(filled), width), dtype=np.int32)
                segments = np.full((len(filled), width), PAD_SEGMENT, dtype=np.int32)
                for b, pack in enumerate(filled):
                    ids[b, :len(pack)], positions[b, :len(pack)], segments[b, :len(pack)] = \
                        pack.ids, pack.positions, pack.segments
                hidden = self.backbone(ms.Tensor(ids), ms.Tensor(positions), ms.Tensor(segments))  # (B, W, H)
                hidden = hidden.reshape(-1, hidden.shape[-1])  # (B*W, H)
                for positions, targets, owners in calls:
                    if plan.mode == "static":  # the head's one shape
                        pad = self.head_size - len(positions)
                        positions, targets = positions + [0] * pad, targets + [[0] * TARGETS] * pad
                    chunk = ops.gather(hidden, ms.Tensor(positions, ms.int32), 0)  # (C, H)
                    picked, best = self.head(chunk, ms.Tensor(np.array(targets, dtype=np.int32)))
                    picked, best = picked.asnumpy(), best.asnumpy()
                    for s, group in enumerate(owners):
                        for k, (index, token) in enumerate(group):
                            logprob[index] += float(picked[s, k])
                            greedy[index] = greedy[index] and int(best[s]) == token
                bar.update(sum(len(pack.starts) for pack in batch))
        return list(zip(logprob, greedy))

    def _layout(self, plan: Plan, rows: dict) -> list:
        """[(packs, width, [(positions, targets (C, TARGETS), owners)] a head call)] a batch of
        `plan`, each position a slot of the flattened (B x width) hidden states scoring up to
        TARGETS tokens; `rows`: input ids -> [(request, first position, targets)]."""
        batches = []
        for batch in batches_of(plan.packs, self.batch_size):
            width = plan.width(len(batch[0]))
            slots: Dict[int, List[Tuple[int, int]]] = {}
            for b, pack in enumerate(batch):
                for row in pack.starts:
                    for index, first, targets in rows[row]:
                        for offset, token in enumerate(targets):
                            slots.setdefault(b * width + pack.index(row, first + offset), []).append((index, token))
            flat, slot_targets, owners = [], [], []
            for position, wanted in slots.items():
                for i in range(0, len(wanted), TARGETS):
                    group = wanted[i:i + TARGETS]
                    flat.append(position)
                    slot_targets.append([t for _, t in group] + [0] * (TARGETS - len(group)))
                    owners.append(group)
            batches.append((batch, width, [(flat[c:c + EVAL_CHUNK], slot_targets[c:c + EVAL_CHUNK],
                                            owners[c:c + EVAL_CHUNK]) for c in range(0, len(flat), EVAL_CHUNK)]))
        return batches

    def _graphs(self, plan: Plan, batches: list) -> List[tuple]:
        """The graphs `plan` runs through, in their order of compile: ("backbone", width) and
        ("head", rows), the size None for the one graph of dynamic shape; none op by op."""
        if plan.mode == "eager":
            return []
        if plan.mode == "dynamic":
            return [("backbone", None), ("head", None)]
        rows = max((len(positions) for *_, calls in batches for positions, _, _ in calls), default=1)
        return [("backbone", w) for w in plan.widths] + [("head", max(head_rows(rows), self.head_size))]

    def _cache_key(self, graphs: List[tuple]) -> dict:
        """What decides the graphs' shapes: the model's config and parameters (not their
        values), the batch size and the graphs in their order of compile."""
        return {"config": json.dumps(self.net.config.to_dict(), sort_keys=True, default=str),
                "parameters": [[p.name, list(p.shape), str(p.dtype)] for p in self.net.get_parameters()],
                "batch": self.batch_size, "graphs": graphs}

    def _compile(self, plan: Plan, graphs: List[tuple]) -> None:
        """Compile the graphs of `plan` ((kind, size): size None is the one graph of dynamic
        shape) not compiled yet, in the given order (the same shapes in the same order in every
        run), so that MindSpore's compile cache (compile_cache.py) can hand them back; graphs a
        later call adds compile outside the cache."""
        import mindspore as ms  # imported here: MindSpore loads after the command's quiet_frameworks

        self.mode, self.widths = plan.mode, plan.widths
        self.head_size = max([size for kind, size in graphs if kind == "head" and size] + [self.head_size])
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
                inputs = [ms.Tensor(shape=[self.batch_size, None], dtype=ms.int32) if size is None else
                          ms.Tensor(np.zeros((self.batch_size, size), np.int32)) for _ in range(3)]  # ids, positions, segments
            else:
                inputs = (ms.Tensor(shape=[None, hidden_size], dtype=ms.float32),
                          ms.Tensor(shape=[None, TARGETS], dtype=ms.int32)) if size is None else \
                    (ms.Tensor(np.zeros((size, hidden_size), np.float32)), ms.Tensor(np.zeros((size, TARGETS), np.int32)))
            cell = self.backbone if kind == "backbone" else self.head
            if size is None:
                # Only the dynamic graph: set_inputs makes every later call check its shapes against
                # these, which a graph a width (several static shapes of one cell) must not.
                cell.set_inputs(*inputs)
            cell.compile(*inputs)
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
