"""The activation sizes a run will measure on its first step, measured before any rank starts.

A run learns each stage's sizes (:class:`~pipesched.memory.StageMemory`: what an ``F`` keeps, what
an ``I`` leaves for ``W``, what a backward holds above its start) from its first step's actions
(:class:`~..metering.observers.SizeLearner`), and its promise is :func:`pipesched.memory.peak` of
them over the rank's program. Here the same code runs before launch, in one process: every stage
built on fake tensors (its blocks built on ``meta``, as shape inference builds them, then given
fake CPU storage under ``FakeTensorMode``: shapes and no data, so the kernels chosen and what
autograd saves are a CPU rank's), each model copy's stages chained on one
microbatch through the runtime's own :class:`~.stage_runner.StageRunner` (``F``, then ``B``, or
``I`` and ``W`` where the schedule splits the backward), metered by the runtime's
:class:`~..metering.memory_meter.ActivationMeter` and learned by its ``SizeLearner``. A stage input
that crosses ranks arrives in a buffer of its own, as a received one does; one handed over on the
same rank shares its sender's storage, as the engine hands it.

Tensor parallelism: the caller's ``shard`` parallelises each stage on a fake mesh
(:mod:`pipesched.runtime.sharding.fake_mesh`), and what autograd saves is then tp rank 0's local
pieces, as the run's meter counts them. The batch context stays real (not fake): Hugging Face
blocks build their masks from its values (:mod:`pipesched.hf.blocks`), as the run does.
FSDP2 sharding changes no activation (the gathered parameters are excluded from the meter).
A kernel whose fake implementation refuses what the CPU runs (the grouped matmul of
transformers' experts, bf16 only) is answered as the CPU kernel allocates
(:mod:`.fake_kernels`), so mixtures of experts are predicted too. What it cannot see: kernels
chosen by a device other than the CPU (a CUDA attention kernel saves other tensors), and code
that reads the values of a fake tensor (an expert loop that picks each expert's tokens by value:
torch raises, and the caller says that nothing was predicted).
Sizes depend on the values of the batch context (packed documents choose another mask) only
through the one microbatch given; the caller runs one of each kind and keeps the largest
(``pipesched.training.launch_checks.activation_peaks``).
"""

from __future__ import annotations

import copy
from typing import Callable, Optional, Sequence

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from ...memory import StageMemory, peak
from ...ops import Op
from ...schedule import Schedule
from ..metering.memory_meter import ActivationMeter
from ..metering.observers import SizeLearner
from ..program.program import lower
from ..stages.copies import ModelCopies
from ..stages.partition import BlockBuilder, Stage, meta_block, stage_block_ranges
from ..stages.precision import Precision
from .fake_kernels import FakeKernels
from .shapes import ShapeBook, infer_boundary_shapes
from .split_backward import WeightGradStash, make_weight_grads_deferrable
from .stage_runner import build_runners

_CPU = torch.device("cpu")


def stage_sizes_ahead(build_block: BlockBuilder, num_blocks: int, schedule: Schedule, loss_fn: Callable,
                      microbatch: tuple[torch.Tensor, torch.Tensor], *, counts: Optional[Sequence[int]] = None,
                      recompute: frozenset = frozenset(), dtype: torch.dtype = torch.float32,
                      context: Optional[dict] = None, shard: Optional[Callable[[nn.Module], object]] = None
                      ) -> dict[int, StageMemory]:
    """Every stage's sizes for one ``microbatch`` (inputs, targets) and its batch ``context``, as
    the runtime measures them on its first step (module doc). ``shard``, if given, is applied to
    each stage on fake tensors as the run applies tensor parallelism to it (after the split
    backward's Linears, as :func:`~pipesched.runtime.sharding.sharding.shard_stage` comes after them)."""
    copies = ModelCopies(schedule)
    model_ranges = stage_block_ranges(num_blocks, copies.length, counts)
    precision = Precision(dtype, "cpu")
    x, y = microbatch
    shapes = ShapeBook(lambda sample, ctx: infer_boundary_shapes(build_block, model_ranges, sample, ctx, device=_CPU),
                       schedule, copies, precision.wire_dtype, x, context)
    kinds = {s: {a[1] for r in range(schedule.ranks) for a in schedule.rank_actions(r) if a[0] == s}
             for s in range(schedule.stages)}
    on_meta = [{i: copy.deepcopy(meta_block(build_block, i)) for i in r} for r in copies.stage_ranges(model_ranges)]
    with FakeTensorMode(allow_non_fake_inputs=True) as mode, FakeKernels():
        stages = {s: Stage(s, {i: _on_fake_cpu(b) for i, b in blocks.items()}) for s, blocks in enumerate(on_meta)}
        meter = ActivationMeter()
        stash = WeightGradStash(hold=meter.hold)
        for stage in stages.values():
            if schedule.split_backward:
                make_weight_grads_deferrable(stage, stash)
            if shard is not None:
                shard(stage)
        meter.exclude(t for stage in stages.values() for t in (*stage.parameters(), *stage.buffers()))
        runners = build_runners(stages, copies, loss_fn, schedule.microbatches, shapes=shapes, precision=precision,
                                meter=meter, stash=stash, recompute=recompute)
        x, y = mode.from_tensor(x), mode.from_tensor(y)  # the context stays real: its values choose masks
        learner = SizeLearner()

        def observed(action, run, *args):
            before = meter.high = meter.current
            out = run(*args)
            learner.observe(action, before, meter.current, meter.high)
            return out

        for first in range(0, schedule.stages, copies.length):
            chain = range(first, first + copies.length)
            for k, split in enumerate((False, True)):  # a B, then an I and its W, where the schedule has them
                backward = Op.I if split else Op.B
                if not any(backward in kinds[s] for s in chain):
                    continue
                given = x
                for s in chain:
                    _, out = observed((s, Op.F, k), runners[s].forward, k, given, y, context, True)
                    if out is not None:
                        given = _arrived(out, schedule.placement, s, precision)
                grads = None
                for s in reversed(chain):
                    kind = backward if backward in kinds[s] else (Op.I if Op.I in kinds[s] else Op.B)
                    grads = observed((s, kind, k), runners[s].backward, k, grads, kind is Op.I)
                    if kind is Op.I:
                        observed((s, Op.W, k), runners[s].weight, k)
                    if grads is not None:
                        grads = _arrived(grads, schedule.placement, s - 1, precision)
    return learner.sizes


def _on_fake_cpu(block: nn.Module) -> nn.Module:
    """``block`` (on meta) with every parameter and buffer a fake CPU tensor of its shape (inside
    ``FakeTensorMode``), a parameter shared inside the block still shared; set in place, as
    ``Module.to_empty`` cannot swap a parameter something else refers to."""
    made: dict[int, torch.Tensor] = {}
    for module in block.modules():
        for table in (module._parameters, module._buffers):
            for name, t in table.items():
                if t is not None:
                    if id(t) not in made:
                        empty = torch.empty_like(t, device=_CPU)
                        made[id(t)] = nn.Parameter(empty, t.requires_grad) if isinstance(t, nn.Parameter) else empty
                    table[name] = made[id(t)]
    return block


def _arrived(entries: list, placement: Sequence[int], sender: int, precision: Precision) -> list:
    """What the next stage of the chain gets: the entries themselves on the sender's rank, else a
    received copy (the wire dtype, in a buffer of its own). ``sender``: the stage next to the
    receiver on the side the entries come from (the lower of the two for gradients)."""
    if placement[sender] == placement[sender + 1]:
        return entries
    return [precision.to_wire(t).clone() for t in entries]


def rank_peaks_ahead(schedule: Schedule, sizes: dict[int, StageMemory]) -> list[float]:
    """Each pipeline rank's predicted peak activation bytes: :func:`pipesched.memory.peak` of
    ``sizes`` over its program, as the runtime predicts it from the sizes it measures."""
    return [peak(lower(schedule, rank).actions, sizes) for rank in range(schedule.ranks)]
