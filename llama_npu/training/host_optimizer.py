"""AdamW on the host (strategies/offload.py): the fp32 master weights, the moments and the fp32
gradient accumulators in host memory, the update by torch's fused CPU AdamW kernel.

The formula is the one the same recipe runs in the graph, MindSpore's nn.AdamWeightDecay
(mindspore/nn/optim/adam.py _update_run_op: no bias correction, decoupled decay on the
matrices only, training/optimizer.py), with g the unscaled, clipped gradient:

    m <- b1 m + (1 - b1) g
    v <- b2 v + (1 - b2) g^2
    w <- w - lr (m / (sqrt(v) + eps) + wd w)

torch's AdamW (aten _fused_adamw_, its CPU kernel) corrects the bias at step t with
c1 = 1 - b1^t, c2 = 1 - b2^t and decays with its own lr and wd:

    w <- w (1 - lr' wd') - (lr' / c1) m / (sqrt(v) / sqrt(c2) + eps')

Its step counter is held at t = 1 (the kernel reads it, torch.optim increments it, we do
not), so c1 = 1 - b1 and c2 = 1 - b2 are fixed, and we pass

    lr' = lr c1 / sqrt(c2),   eps' = eps / sqrt(c2),   wd' = lr wd / lr'

which gives (lr' / c1) m / (sqrt(v) / sqrt(c2) + eps') = lr m / (sqrt(v) + eps) and
1 - lr' wd' = 1 - lr wd: MindSpore's update, rounded in another order (fp32, about 1e-7).

The states are MindSpore Parameters named as the in-graph optimizer names them (the master
by the weight's name, `adam_m.`/`adam_v.` + name, `global_step`, `learning_rate`), held by
this Cell, so checkpoints/files.py saves them as it does the in-graph ones and a run resumes
across the switch; the torch tensors are views of their host memory. No graph ever reads
them: the card's Parameters keep only the compute-dtype copy this pushes to them. Under data
parallel each rank holds only its range of them (training/host_shards.py): a Parameter of a
tensor cut across ranks is its flat range, the ranks gather the whole tensors to save, and a
resume loads the whole tensors and keeps this rank's ranges.
"""
from __future__ import annotations

import math

import numpy as np
import torch

import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn

from ..recipe.schema import OptimizerSection
from ..weights.tensor_files import to_float32
from .host_shards import CardExchange, ShardLayout, is_matrix

BIAS_STEP = 1.0  # the step torch's kernel corrects the bias for: see the module's docstring


def _flat(param) -> torch.Tensor:
    """A flat torch view of a host Parameter's memory (asnumpy shares a CPU tensor's memory)."""
    return torch.from_numpy(param.asnumpy()).reshape(-1)


def _torch(tensor) -> torch.Tensor:
    """A card output in torch, without a copy: MindSpore gives bfloat16 as ml_dtypes' numpy
    bfloat16, which torch.from_numpy refuses, so its bits go through as uint16."""
    values = tensor.asnumpy()
    if tensor.dtype == ms.bfloat16:
        return torch.from_numpy(values.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(values)


class WholeStates(nn.Cell):
    """Whole fp32 masters and moments (`values`: name -> flat numpy) under the in-graph names,
    with the step counter and learning rate: what rank 0 saves under data parallel."""

    def __init__(self, card, values: dict, global_step, learning_rate):
        super().__init__(auto_prefix=False)
        whole = lambda prefix: ParameterTuple(  # noqa: E731
            Parameter(Tensor(values[prefix + p.name].reshape(p.shape)), name=prefix + p.name, requires_grad=False)
            for p in card)
        self.masters, self.moments1, self.moments2 = whole(""), whole("adam_m."), whole("adam_v.")
        self.global_step = Parameter(Tensor(global_step.asnumpy().copy()), name="global_step", requires_grad=False)
        self.learning_rate = Parameter(Tensor(learning_rate.asnumpy().copy()), name="learning_rate",
                                       requires_grad=False)


class HostAdamW(nn.Cell):
    """The host's states for the card's trainable Parameters `card` (built fp32, as without
    offload): copies this rank's ranges of them (all of them on one card) as the fp32 masters,
    then leaves the card the matrices in `compute_dtype`."""

    def __init__(self, card, section: OptimizerSection, threads: int, compute_dtype, rank: int = 0, ranks: int = 1):
        super().__init__(auto_prefix=False)
        self.card = list(card)
        self.layout = ShardLayout(self.card, rank, ranks)

        def held(prefix, values):
            return ParameterTuple(Parameter(Tensor(values(i, a, b)), name=prefix + self.card[i].name,
                                            requires_grad=prefix == "") for i, a, b in self.layout.pieces)

        # The masters first, then the card's fp32 copies cast away by the first push, then the
        # moments and accumulators: the host never holds the card's fp32 weights beside all
        # 16 bytes a parameter of states (20 at the peak, where the planner counts 16).
        self.masters = held("", self._initial)
        self.section = section
        self.card_dtypes = [compute_dtype if is_matrix(p) else ms.float32 for p in self.card]
        self.exchange = None  # data parallel: CardExchange, built at the first push
        self.weights = [_flat(p) for p in self.masters]
        self.push()
        zeros = lambda i, a, b: np.zeros(self._piece_shape(i, a, b), np.float32)  # noqa: E731
        self.moments1, self.moments2 = held("adam_m.", zeros), held("adam_v.", zeros)
        self.global_step = Parameter(Tensor([0], ms.int32), name="global_step", requires_grad=False)
        self.learning_rate = Parameter(Tensor(section.lr, ms.float32), name="learning_rate", requires_grad=False)
        self.accumulators = [torch.zeros(b - a, dtype=torch.float32) for _, a, b in self.layout.pieces]
        self.steps = [torch.tensor(BIAS_STEP) for _ in self.layout.pieces]
        torch.set_num_threads(threads)
        self.bind()

    def _piece_shape(self, index: int, start: int, stop: int) -> tuple:
        """A Parameter's shape: the tensor's own when the rank holds it whole, else its flat range."""
        return tuple(self.card[index].shape) if self.layout.whole((index, start, stop)) else (stop - start,)

    def _initial(self, index: int, start: int, stop: int) -> np.ndarray:
        flat = self.card[index].asnumpy().astype(np.float32).reshape(-1)[start:stop]
        return flat.reshape(self._piece_shape(index, start, stop)).copy()

    @property
    def master_params(self) -> list:
        return list(self.masters)

    @property
    def sharded(self) -> bool:
        """Whether the ranks must gather the states to save them (data parallel)."""
        return self.layout.ranks > 1

    def held_elements(self) -> int:
        """The fp32 elements of each state this rank's host holds (masters; the moments and the
        accumulators hold as many)."""
        return sum(p.size for p in self.masters)

    def bind(self) -> None:
        """Flat torch views of the states' host memory."""
        self.weights = [_flat(p) for p in self.masters]
        self.exp_avgs = [_flat(p) for p in self.moments1]
        self.exp_avg_sqs = [_flat(p) for p in self.moments2]

    def push(self) -> None:
        """The masters, cast to the card's dtypes, into the card's Parameters: the next forward
        reads them (a host write of a Parameter that a graph reads unconditionally is seen by its
        next run, MindSpore 2.9.0; tests/test_offload.py checks the losses). assign_value is what
        Parameter.set_data ends in (mindspore/common/parameter.py _update_tensor_data), without
        set_data's cast back to the Parameter's dtype: the first push turns the matrices, built
        fp32, into compute-dtype Parameters (the test counts the graph's fp16 matrices). Under
        data parallel the host sends its range of the matrices, and the card gathers them
        whole from every rank's (CardExchange)."""
        def to_card(index, values):
            param = self.card[index]
            param.assign_value(Tensor(values.reshape(param.shape), dtype=self.card_dtypes[index]))

        for (index, _, _), master in zip(self.layout.pieces, self.weights):
            if not self.sharded or index not in self.layout.offsets:  # whole on this rank
                to_card(index, master.numpy())
        if self.sharded:
            if self.exchange is None:  # the matrices in the compute dtype before a graph assigns them
                for index in self.layout.matrices:
                    to_card(index, self.card[index].asnumpy())
                self.exchange = CardExchange(self.card, self.layout)
            own = np.zeros(self.layout.shard, np.float32)
            matrices = [w for (index, _, _), w in zip(self.layout.pieces, self.weights) if index in self.layout.offsets]
            if matrices:
                torch.cat(matrices, out=torch.from_numpy(own[:sum(w.numel() for w in matrices)]))
            self.exchange(Tensor(own, dtype=self.card_dtypes[self.layout.matrices[0]]))

    def loaded(self) -> None:
        """After checkpoints/files.py loaded the states into this Cell."""
        self.push()

    def load_whole(self, weights: dict, states: dict) -> list:
        """This rank's ranges of a checkpoint's whole tensors (`weights`, `states`: name ->
        StoredTensor of model.ckpt and optimizer.ckpt, weights/tensor_files.py ckpt_index) into
        its states, in place, a memory-mapped tensor at a time: the host holds its states and
        one tensor, where mindspore.load_checkpoint would parse both files whole beside them
        (12 more bytes a parameter). Returns what is missing or of another size, loading
        nothing then."""
        sources = [(weights, "", self.weights), (states, "adam_m.", self.exp_avgs), (states, "adam_v.", self.exp_avg_sqs)]
        wrong = [f"{prefix}{p.name}" for source, prefix, _ in sources for p in self.card
                 if prefix + p.name not in source or math.prod(source[prefix + p.name].shape) != p.size]
        wrong += [name for name in ("global_step", "learning_rate") if name not in states]
        if wrong:
            return wrong
        for source, prefix, targets in sources:
            for (index, start, stop), target in zip(self.layout.pieces, targets):
                stored = source[prefix + self.card[index].name]
                whole = stored.read().reshape(-1)[start:stop]
                target.copy_(torch.from_numpy(to_float32(whole, stored.code)))
        self.global_step.asnumpy()[...] = states["global_step"].read().reshape(self.global_step.shape)
        self.learning_rate.asnumpy()[...] = states["learning_rate"].read().reshape(self.learning_rate.shape)
        return []

    def whole_states(self) -> tuple[list, nn.Cell]:
        """(model params, optimizer Cell) to save: this Cell's own on one card; under data
        parallel the whole tensors gathered from every rank (a collective: every rank calls it;
        all receive them, the caller saves on rank 0)."""
        if not self.sharded:
            return self.master_params, self
        values = {}
        for prefix, held in (("", self.weights), ("adam_m.", self.exp_avgs), ("adam_v.", self.exp_avg_sqs)):
            for (index, _, _), piece in zip(self.layout.pieces, held):
                if index not in self.layout.offsets:
                    values[prefix + self.card[index].name] = piece.numpy().copy()
            self.layout.gather(held, lambda index, whole, p=prefix: values.__setitem__(p + self.card[index].name, whole))
        whole = WholeStates(self.card, values, self.global_step, self.learning_rate)
        return list(whole.masters), whole

    def accumulate(self, grads, embedding_index: int = -1, tokens=None, rows=None) -> None:
        """Add one micro-batch's gradients (the card's outputs, compute dtype; under data
        parallel this rank's flat ranges of them) into the fp32 accumulators of its ranges; `rows` (B, T, H), the tied embedding's lookup
        gradient (one card: under data parallel the card added them before the all-reduce),
        added at the rows of `tokens` (B, T) in fp32, as the in-graph step adds them into fp32
        gradients."""
        for (index, _, _), acc in zip(self.layout.pieces, self.accumulators):
            acc.add_(_torch(grads[index]).reshape(-1))
        if rows is not None:
            width = rows.shape[-1]
            index = torch.from_numpy(tokens.reshape(-1).astype(np.int64))
            added = _torch(rows).reshape(-1, width).to(torch.float32)
            piece = [i for i, (p, _, _) in enumerate(self.layout.pieces) if p == embedding_index][0]
            self.accumulators[piece].view(-1, width).index_add_(0, index, added)

    def square_sum(self) -> float:
        """The sum of squares of this rank's accumulators, in fp32 tensor by tensor in the
        parameters' order as the in-graph step sums (training/step.py _self_dot, then AddN);
        under data parallel the vectors, which every rank holds, only on rank 0, so that the
        ranks' sums add up to the whole."""
        total = torch.zeros((), dtype=torch.float32)
        for (index, _, _), acc in zip(self.layout.pieces, self.accumulators):
            if self.layout.rank == 0 or index in self.layout.offsets:
                total += torch.dot(acc, acc)
        return float(total)

    def step(self, lr: float, scale: float, grad_clip: float, overflow: bool, square_sum: float) -> float:
        """Unscale, clip and update unless `overflow`; zero the accumulators. `square_sum`: the
        gradients' sum of squares over every rank (square_sum's, summed). Returns the
        gradients' global norm after unscaling, before clipping."""
        f32 = np.float32
        norm = f32(math.sqrt(square_sum)) / f32(scale)
        self.learning_rate.asnumpy()[...] = lr  # assigned every step, as the in-graph step does
        if not overflow:
            factor = f32(1.0) / f32(scale)
            if grad_clip > 0 and norm > f32(grad_clip):
                factor = factor * (f32(grad_clip) / (norm + f32(1e-6)))
            for acc in self.accumulators:
                acc.mul_(float(factor))
            self.update(lr)
            self.push()
        for acc in self.accumulators:
            acc.zero_()
        return float(norm)

    def update(self, lr: float) -> None:
        o = self.section
        c1, c2 = 1.0 - o.beta1 ** BIAS_STEP, 1.0 - o.beta2 ** BIAS_STEP
        lr_t, eps_t = lr * c1 / math.sqrt(c2), o.eps / math.sqrt(c2)
        for decayed in (True, False):
            chosen = [n for n, (i, _, _) in enumerate(self.layout.pieces) if is_matrix(self.card[i]) == decayed]
            if not chosen:
                continue
            decay = lr * (o.weight_decay if decayed else 0.0) / lr_t if lr_t else 0.0
            pick = lambda tensors: [tensors[n] for n in chosen]  # noqa: E731
            torch._fused_adamw_(pick(self.weights), pick(self.accumulators), pick(self.exp_avgs),
                                pick(self.exp_avg_sqs), [], pick(self.steps), lr=lr_t, beta1=o.beta1,
                                beta2=o.beta2, weight_decay=decay, eps=eps_t, amsgrad=False, maximize=False)
        self.global_step.asnumpy()[...] += 1
