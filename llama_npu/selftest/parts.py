"""What every selftest check is made of: its result (`Check`), the run's `Context`, and the
tiny network, batches and train step the checks build their subject and reference from.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from ..model.llama import fused_kernels
from ..recipe.load import load_recipe
from ..strategies.precision import LossScaler

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "recipes" / "cpu_smoke.yaml"
SEQ = 32
PASS, FAIL, SKIP = "pass", "fail", "skip"
MAX, MIN = "max", "min"


@dataclass
class Check:
    name: str
    category: str
    status: str
    figure: Optional[float] = None
    tolerance: Optional[float] = None
    reason: str = ""
    bound: str = MAX  # MAX: the figure may not exceed the tolerance (a ceiling); MIN: not fall below it (a floor)
    compares: str = ""

    def line(self) -> str:
        measured = "" if self.figure is None else f"  {self.figure:.3g}"
        if self.figure is not None and self.tolerance is not None:
            measured += f" ({'at least' if self.bound == MIN else 'at most'} {self.tolerance:.3g})"
        return f"{self.name:<34}{self.status:<6}{measured}{'  ' + self.reason if self.reason else ''}"


def within(figure: float, tolerance: float, bound: str = MAX) -> bool:
    return math.isfinite(figure) and (figure >= tolerance if bound == MIN else figure <= tolerance)


@dataclass
class Spec:
    """What a check compares on this context, against which tolerance and bound, and the
    recipes it builds (each a tuple of --set overrides for Context.recipe, or a recipe file
    with its overrides: (path, overrides));
    `skip` says why this context cannot run it. `selftest --dry-run` builds these without
    running anything; the check itself builds its recipes from the same Spec."""
    name: str
    category: str
    compares: str
    tolerance: Optional[float] = None
    bound: str = MAX
    recipes: tuple = ()
    files: tuple = ()
    skip: str = ""

    def skipped(self, reason: str = "", figure: Optional[float] = None) -> Check:
        return Check(self.name, self.category, SKIP, figure, self.tolerance, reason or self.skip, self.bound,
                     self.compares)

    def result(self, ok: bool, figure: Optional[float], what: str) -> Check:
        """PASS or FAIL as `ok` says, with `what` as the reason of a failure."""
        return Check(self.name, self.category, PASS if ok else FAIL, figure, self.tolerance, "" if ok else what,
                     self.bound, self.compares)

    def judged(self, figure: float, what: str) -> Check:
        """Pass when the figure is within the tolerance on the Spec's side of it."""
        return self.result(within(figure, self.tolerance, self.bound), figure, what)


@dataclass
class Context:
    target: str  # "cpu" | "ascend"
    soc: str  # "cpu", "910a", "910b", ...
    workers: int = 1
    speed: bool = False
    device: dict = field(default_factory=dict)
    rank: int = 0
    work: Optional[Path] = None  # a directory every rank shares (selftest_sharded.work_dir)
    sharded_runs: dict = field(default_factory=dict)  # layout -> its trained training.session.Session
    trained: Optional[tuple] = None  # trained_once's
    speed_run: Optional[dict] = None  # selftest.speed_figures'

    @property
    def flash_attention(self) -> bool:
        return fused_kernels(self.target == "ascend", self.soc)

    @property
    def bf16(self) -> bool:
        return self.target == "ascend" and self.soc != "910a"

    def recipe(self, *overrides):
        """The smoke recipe at selftest's size for this device, with `overrides`; validated for
        the context's workers (under msrun, the launched ones; in a dry run, the ones the
        check would run on)."""
        device = [] if self.target == "cpu" else ["device.target=ascend", f"device.name={self.soc}"]
        return load_recipe(SMOKE, [f"data.max_seq_len={SEQ}", "data.eval_files=[]", "train.global_batch_size=0",
                                   "train.micro_batch_size=2", "train.warmup_steps=0", *device, *overrides],
                           workers=self.workers)


def build(ctx: Context, *overrides):
    import mindspore as ms  # imported here: MindSpore loads after run_selftest's quiet_frameworks

    from ..strategies.network import build_network

    ms.set_seed(0)
    recipe = ctx.recipe(*overrides)
    net, cell = build_network(recipe, on_ascend=ctx.target == "ascend")
    return recipe, net, cell


def train_step(recipe, net, cell, k: int = 1, optimizer=None):
    """Our TrainStep for k micro-batches, with a new optimizer or another step's."""
    # imported here: MindSpore loads after run_selftest's quiet_frameworks
    from ..steps.optimizer import build_optimizer
    from ..steps.graph_step import TrainStep

    optimizer = optimizer or build_optimizer(net.trainable_params(), recipe.train)
    return TrainStep(cell, optimizer, LossScaler(recipe.strategies.precision), recipe.train.grad_clip, k)


def random_batch(rows: int, seed: int, seq: int = SEQ):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 128000, (rows, seq + 1)).astype(np.int32)
    labels = ids.copy()
    labels[:, :2] = -100
    return ids, labels


def weights(net) -> dict:
    return {p.name: p.asnumpy().copy() for p in net.trainable_params()}


# trained_once's recipe: fp16 with a dynamic loss scale whose window (2) is reached within
# resume_exact's steps, so the scale and its clean-step count change across the resume.
TRAINED_ONCE = ("strategies.precision.amp_level=O2", "strategies.precision.dtype=float16",
                "strategies.precision.loss_scale=dynamic", "strategies.precision.loss_scale_init=1024",
                "strategies.precision.loss_scale_window=2")


def trained_once(ctx: Context) -> tuple:
    """(recipe, net, its TrainStep) after one step on a fixed batch, built once a run: the
    resume and export checks start from it (two compiles fewer). Each takes the weights as
    it finds them; resume_exact steps them on."""
    if ctx.trained is None:
        recipe, net, cell = build(ctx, *TRAINED_ONCE)
        step = train_step(recipe, net, cell)
        step([random_batch(2, 51)], lr=1e-2)
        ctx.trained = (recipe, net, step)
    return ctx.trained
