"""AdamW on the host (strategies/offload.py): the fp32 master weights, the moments and the fp32
gradient accumulators in host memory, the update by our fused CPU kernel (steps/host/kernel.py,
numba: CPU-only wheels on x86_64 and aarch64).

The formula is the one the same recipe runs in the graph, MindSpore's nn.AdamWeightDecay
(mindspore/nn/optim/adam.py: no bias correction, decoupled decay on the matrices only,
steps/optimizer.py), with g the unscaled, clipped gradient:

    m <- b1 m + (1 - b1) g
    v <- b2 v + (1 - b2) g^2
    w <- w - lr (m / (sqrt(v) + eps) + wd w)

written directly in fp32, in the order of the fp32 CPU kernel the graph runs
(nnacl/fp32/adam_fp32.c AdamWeightDecayFp32's scalar loop): m += (g - m)(1 - b1),
v += (g g - v)(1 - b2), w -= lr (m / (sqrt(v) + eps) + wd w). The unscale-and-clip factor
multiplies each accumulator element as the kernel reads it (one fp32 product, as the separate
in-place multiply before it gave), so the step makes one pass over the states.

The states are MindSpore Parameters named as the in-graph optimizer names them (the master
by the weight's name, `adam_m.`/`adam_v.` + name, `global_step`, `learning_rate`), held by
this Cell, so checkpoints/files.py saves them as it does the in-graph ones and a run resumes
across the switch; the kernels work on flat numpy views of their host memory. No graph ever reads
them: the card's Parameters keep only the compute-dtype copy this pushes to them. Under data
parallel each rank holds only its range of them (steps/host/shards.py): a Parameter of a
tensor cut across ranks is its flat range, the ranks gather the whole tensors to save, and a
resume loads the whole tensors and keeps this rank's ranges.
"""
from __future__ import annotations

import math

import numba
import numpy as np

import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn

from ...recipe.schema import OptimizerSection
from ...weights.tensor_files import to_float32
from . import kernel as host_kernel
from .shards import CardExchange, ShardLayout, is_matrix


def _flat(tensor) -> np.ndarray:
    """A flat numpy view of a host Parameter's or Tensor's memory (asnumpy shares a CPU
    tensor's memory)."""
    return tensor.asnumpy().reshape(-1)


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
        # Host Tensors sharing their numpy arrays' memory (the kernels add into `self.sums`).
        self.accumulators = [Tensor.from_numpy(np.zeros(b - a, np.float32)) for _, a, b in self.layout.pieces]
        self.sums = [_flat(acc) for acc in self.accumulators]
        # numba's pool has one thread a core (NUMBA_NUM_THREADS): a recipe's larger count runs on it.
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
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
        """Flat numpy views of the states' host memory."""
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
                to_card(index, master)
        if self.sharded:
            if self.exchange is None:  # the matrices in the compute dtype before a graph assigns them
                for index in self.layout.matrices:
                    to_card(index, self.card[index].asnumpy())
                self.exchange = CardExchange(self.card, self.layout)
            own = np.zeros(self.layout.shard, np.float32)
            matrices = [w for (index, _, _), w in zip(self.layout.pieces, self.weights) if index in self.layout.offsets]
            if matrices:
                np.concatenate(matrices, out=own[:sum(w.size for w in matrices)])
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
                target[...] = to_float32(whole, stored.code)
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
                    values[prefix + self.card[index].name] = piece.copy()
            self.layout.gather(held, lambda index, whole, p=prefix: values.__setitem__(p + self.card[index].name, whole))
        whole = WholeStates(self.card, values, self.global_step, self.learning_rate)
        return list(whole.masters), whole

    def accumulate(self, grads, embedding_index: int = -1, tokens=None, rows=None) -> None:
        """Add one micro-batch's gradients (the card's outputs, compute dtype; under data
        parallel this rank's flat ranges of them) into the fp32 accumulators of its ranges; `rows` (B, T, H), the tied embedding's lookup
        gradient (one card: under data parallel the card added them before the all-reduce),
        added at the rows of `tokens` (B, T) in fp32, as the in-graph step adds them into fp32
        gradients."""
        for (index, _, _), acc in zip(self.layout.pieces, self.sums):
            host_kernel.accumulate(acc, grads[index].asnumpy())
        if rows is not None:
            width = rows.shape[-1]
            added = rows.asnumpy().reshape(-1, width).astype(np.float32)  # exact from fp16 and bf16
            piece = [i for i, (p, _, _) in enumerate(self.layout.pieces) if p == embedding_index][0]
            host_kernel.add_rows(self.sums[piece].reshape(-1, width), tokens.reshape(-1).astype(np.int64), added)

    def square_sum(self) -> float:
        """The sum of squares of this rank's accumulators, in fp32 tensor by tensor in the
        parameters' order as the in-graph step sums (steps/graph_step.py _self_dot, then AddN);
        under data parallel the vectors, which every rank holds, only on rank 0, so that the
        ranks' sums add up to the whole."""
        total = np.float32(0.0)
        for (index, _, _), acc in zip(self.layout.pieces, self.sums):
            if self.layout.rank == 0 or index in self.layout.offsets:
                total += np.dot(acc, acc)  # fp32 (BLAS sdot)
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
            self.update(lr, factor)
            self.push()
        for acc in self.sums:
            acc.fill(0.0)
        return float(norm)

    def update(self, lr: float, scale: float = 1.0) -> None:
        """The fused AdamW (steps/host/kernel.py) over each piece, the gradient its
        accumulator times `scale`; weight decay on the matrices only."""
        o = self.section
        for (index, _, _), w, g, m, v in zip(self.layout.pieces, self.weights, self.sums, self.exp_avgs,
                                              self.exp_avg_sqs):
            decay = o.weight_decay if is_matrix(self.card[index]) else 0.0
            host_kernel.adamw(w, g, m, v, lr, o.beta1, o.beta2, o.eps, decay, scale)
        self.global_step.asnumpy()[...] += 1
