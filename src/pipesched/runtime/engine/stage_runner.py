"""A ``StageRunner`` per owned stage: its compute on each microbatch and what that leaves behind.

The engine (:mod:`.engine`) decides *when*; the runner says *what* a stage's ``F``, ``I``, ``W`` and
``B`` do, and owns the state a microbatch's actions hand each other: the stage input (leaves that
collect the input gradient), the outputs to backward from, the Linear backward halves an ``I``
stashes for its ``W`` (:mod:`.split_backward`), and the activation meter's holds on the input.
It also owns the rules that go with them:

- **deallocation** (Megatron's): once a forward's outputs are handed on, their data lives on only
  where the next stage or a saved tensor holds it; the backward needs only their graphs;
- **loss scaling**: a loss stage backwards from its loss times ``1/m``, as the unpipelined mean
  over the step's microbatches does;
- **recomputation** and **autocast** of the stage's forward (:mod:`.recompute`, :mod:`.precision`);
- the microbatch's **batch context**, an argument of every call (:mod:`.batch_context`);
- the stage's **part** (:class:`StagePart`), what depends on how the stage is laid out, chosen
  once with the runtime's strategy (:mod:`~pipesched.runtime.strategy`): a sharded stage's
  compute waits for the all-gather its ``UNSHARD`` started, its backwards run with gradient sync
  off, its ``REDUCE_GRAD`` reduce-scatters (:class:`~..sharding.sharding.StageSharding`); a whole
  stage gathers nothing and sums its share of a tied weight apart (:class:`~.tied_sums.WholeStage`).

Tensors cross between runners as flat entry lists (:mod:`.boundary`): a received message, or the
detached outputs of a stage on the same rank.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Callable, Optional, Protocol

import torch

from ..metering.memory_meter import ActivationMeter
from ..stages.boundary import flat
from ..stages.partition import Stage
from ..stages.precision import Precision
from .recompute import recomputed_forward
from .shapes import ShapeBook
from .split_backward import WeightGradStash, apply_weight_grads
from .tied_sums import whole_parts

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class StagePart(Protocol):
    """What a stage's compute and its program's ``UNSHARD``, ``RESHARD`` and ``REDUCE_GRAD`` do
    that depends on the stage's layout, whole or sharded (one implementation each)."""

    def unshard(self) -> None:
        """``UNSHARD``: start gathering the stage's parameters."""

    def ready(self) -> None:
        """Before a compute: the parameters the stage computes with are there."""

    def reshard(self) -> None:
        """``RESHARD``: free the gathered parameters."""

    def forward(self) -> AbstractContextManager:
        """Around the stage's forward (a recomputed one's too)."""

    def backward(self) -> AbstractContextManager:
        """Around each backward (``B``, ``I``, ``W``) of the stage."""

    def reduce_grad(self) -> None:
        """``REDUCE_GRAD``: the stage's last backward of the step is done."""


class StageRunner:
    """Stage ``index``'s compute (module ``stage``, model stage ``model_stage``): the first stage
    of its model copy takes the batch's inputs, the last computes the loss with ``loss_fn``."""

    def __init__(self, index: int, stage: Stage, *, model_stage: int, takes_inputs: bool, computes_loss: bool,
                 loss_fn: LossFn, microbatches: int, shapes: ShapeBook, precision: Precision,
                 meter: ActivationMeter, stash: WeightGradStash, part: StagePart, recompute: bool = False) -> None:
        self.index, self.module, self.model_stage, self.part = index, stage, model_stage, part
        self.takes_inputs, self.computes_loss = takes_inputs, computes_loss
        self.loss_fn, self.loss_scale = loss_fn, 1.0 / microbatches
        self.shapes, self.precision, self.meter, self.stash, self.recompute = shapes, precision, meter, stash, recompute
        self.input_bytes = 0  # one microbatch's stage input, as the meter counts it
        self._inputs: dict[int, list] = {}  # microbatch -> the stage input's entries (leaves)
        self._outputs: dict[int, list] = {}  # microbatch -> what its backward starts from
        self._holds: dict[int, list] = {}  # microbatch -> the meter's holds on the stage input
        self._deferred: dict[int, tuple] = {}  # microbatch -> (stashed Linear backward halves, holds)

    # -- the four computes -------------------------------------------------------------------

    def forward(self, k: int, given, target: Optional[torch.Tensor], context: Optional[dict],
                metering: bool) -> tuple[Optional[torch.Tensor], Optional[list[torch.Tensor]]]:
        """Microbatch ``k``'s forward. ``given``: the batch's input on a first stage, else the
        entries of the stage input (received, or handed over in memory). Returns ``(loss, None)``
        on a loss stage (the loss detached), else ``(None, the output entries detached)``."""
        if self.takes_inputs:
            x, xs = given, [given]
        else:
            xs = given
            for t in xs:
                if t.is_floating_point():
                    t.requires_grad_(True)
            x = self.shapes.boundaries[self.model_stage - 1].unflatten(xs)
        # no local alias: the holds are released with the backward (a name left here would keep
        # the last forward's stage input counted through the backward that follows it)
        self._holds[k] = [self.meter.hold(t) for t in xs]
        self.input_bytes = sum(h.nbytes for h in self._holds[k])
        self._inputs[k] = xs
        self.part.ready()
        y = self._compute(x, target, context, metering)
        if self.computes_loss:
            self._outputs[k] = [y * self.loss_scale]
            return y.detach(), None
        ys = flat(y)
        handed = [t.detach() for t in ys]  # before the data is freed: they keep it for the next stage
        self._outputs[k] = _deallocated(ys)
        return None, handed

    def backward(self, k: int, output_grads: Optional[list[torch.Tensor]], split: bool) -> Optional[list[torch.Tensor]]:
        """Microbatch ``k``'s backward from the gradients of its outputs (None on a loss stage):
        ``B`` (``split`` False) or ``I`` (True: the Linears' weight halves stashed for :meth:`weight`).
        Returns the stage input's gradients (None on a first stage)."""
        outs = self._outputs.pop(k)
        if self.computes_loss:
            tensors, grads = outs, None
        else:
            pairs = [(t, g.to(t.dtype)) for t, g in zip(outs, output_grads) if t is not None]
            tensors, grads = [t for t, _ in pairs], [g for _, g in pairs]  # a bf16 wire gradient of an fp32 output
        with self.part.backward():
            if split:
                self._deferred[k] = self._collecting(tensors, grads)
            elif tensors:
                torch.autograd.backward(tensors, grads)
        del outs, tensors, grads
        self._holds.pop(k)
        xs = self._inputs.pop(k)
        if self.takes_inputs:
            return None
        return [t.grad if t.grad is not None else torch.zeros_like(t) for t in xs if t.is_floating_point()]

    def weight(self, k: int) -> None:
        """Microbatch ``k``'s ``W``: the weight gradients its ``I`` stashed."""
        entries, _holds = self._deferred.pop(k)
        with self.part.backward():
            apply_weight_grads(entries)

    # -- helpers -----------------------------------------------------------------------------

    def _compute(self, x, target, context, metering):
        """The stage on ``x`` (and the loss against ``target`` on a loss stage), its saved tensors
        counted on a metered step; a recomputed stage keeps only its blocks' inputs and is rebuilt
        one block at a time (counted) when its backward needs it."""
        meter = self.meter if metering else None
        with meter.saved_tensors() if meter is not None else nullcontext(), self.precision.autocast(), self.part.forward():
            if self.recompute:
                y = recomputed_forward(self.module, x, meter, context)
            else:
                y = self.module(x, context)
            return self.loss_fn(y, target) if self.computes_loss else y

    def _collecting(self, tensors, grads) -> tuple[list, list]:
        """Backward for the input gradient only, the Linears' weight halves collected."""
        entries: list = []
        self.stash.collecting = entries
        try:
            if tensors:
                torch.autograd.backward(tensors, grads)
        finally:
            self.stash.collecting = None
        holds, self.stash.holders = self.stash.holders, []
        return entries, holds


def build_runners(stages: dict[int, Stage], copies, loss_fn: LossFn, microbatches: int, *, shapes: ShapeBook,
                  precision: Precision, meter: ActivationMeter, stash: WeightGradStash,
                  recompute: frozenset = frozenset(), parts: Optional[dict[int, StagePart]] = None) -> dict[int, StageRunner]:
    """A runner for each of ``stages`` (schedule stage -> module); ``copies``
    (:class:`~.copies.ModelCopies`) says which stage takes the inputs and which computes the loss;
    ``parts``: each stage's :class:`StagePart`, the runtime strategy's (default: whole stages
    sharing no tied weight)."""
    parts = parts if parts is not None else whole_parts(stages)
    return {s: StageRunner(s, stage, model_stage=copies.model_stage(s), takes_inputs=copies.takes_inputs(s),
                           computes_loss=copies.computes_loss(s), loss_fn=loss_fn, microbatches=microbatches,
                           shapes=shapes, precision=precision, meter=meter, stash=stash, part=parts[s],
                           recompute=s in recompute)
            for s, stage in stages.items()}


def _deallocated(outputs: list[torch.Tensor]) -> list[Optional[torch.Tensor]]:
    """Per floating output, the tensor to backward from with its data freed (None where it needs no
    gradient): the backward needs only its graph."""
    kept = []
    for t in outputs:
        if t.is_floating_point():
            if t.requires_grad:
                t.data = torch.empty((), dtype=t.dtype, device=t.device).expand(t.shape)
                kept.append(t)
            else:
                kept.append(None)
    return kept
