"""FSDP2 and tensor parallelism inside a pipeline stage, and the operations a rank's program runs on it.

:func:`shard_stage` splits a stage as torchtitan does: tensor parallelism first
(``parallelize_module``, :mod:`.tp_plans`), then ``fully_shard`` on each block and on the stage
(HSDP when the mesh has replicas). The program then drives FSDP itself, as torch's pipelining
runtime does (``stage.py``: ``backward_maybe_with_nosync``, ``perform_reduce_grad``):

- :func:`unshard` starts the all-gather of every FSDP group of the stage and returns the handles;
  :func:`wait` waits for them (the compute that needs the parameters); :func:`reshard` frees them;
- :func:`no_sync_backward` before every ``B``, ``I`` and ``W``: no reduction, the unsharded
  gradients accumulate in full size across microbatches and the parameters stay gathered
  (the split backward's ``W``, :func:`~.split_backward.apply_weight_grads`, adds into the
  ``.grad`` of those gathered parameters, so a stage's reduction waits for its last ``W``);
- :func:`reduce_grad` once per stage and step, after its last backward: FSDP's post-backward
  of every group (the reduce-scatter, and the replicas' all-reduce under HSDP), the root's final
  callback, then one division of the sharded gradients.

Reductions are forced to SUM with a divide factor of 1 (gloo has no ``PREMUL_SUM``, which FSDP
picks for a factor without forced sums; forced sums alone still divide by the data-parallel
size afterwards), so FSDP divides nothing and the one division is by the whole count: :func:`gradient_divisor`
(microbatches x replicas x shards for a loss that is a mean per microbatch) or, for a
token-weighted loss summed per microbatch, the step's global token count. Never both.

A parameter shared by two blocks (GPT-2's tied embedding and head on one stage) is left to the
stage's root group: a block's group would gather it for that block only. Two stages of a rank
never share one: the runtime gives each stage its own copy first (:mod:`..comm.tied_copies`).
"""

from __future__ import annotations

import logging
import warnings
from contextlib import AbstractContextManager, contextmanager
from typing import Callable, Iterable, Iterator, Optional

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from ...errors import ConfigError
from ...parallel_layout import ParallelLayout
from ..comm.expert_mesh import is_expert
from .expert_parallel import shard_experts
from .sharded_mesh import ShardedMesh
from .tp_plans import Plan, apply_tp
from .tp_styles import fsdp_placement


def stage_blocks(module: nn.Module) -> list[nn.Module]:
    """The blocks of a stage: a pipesched Stage's ``blocks``, else the module's children."""
    blocks = getattr(module, "blocks", None)
    return list(blocks.values()) if isinstance(blocks, nn.ModuleDict) else list(module.children())


def _own_blocks(blocks: list[nn.Module]) -> list[nn.Module]:
    """The blocks with parameters that share none of them with another block."""
    holders: dict[int, int] = {}
    for block in blocks:
        for p in block.parameters():
            holders[id(p)] = holders.get(id(p), 0) + 1
    return [b for b in blocks if any(True for _ in b.parameters()) and all(holders[id(p)] == 1 for p in b.parameters())]


def shard_stage(module: nn.Module, mesh: ShardedMesh, plan: Plan, reshard_after_forward: bool = False) -> FSDPModule:
    """Split ``module`` in place (tensor parallelism by ``plan``, then FSDP over ``mesh.dp_mesh``)
    and return it, now an ``FSDPModule``. ``reshard_after_forward`` False keeps each group
    gathered from its forward to its backward (torchtitan's choice under pipelining: no second
    all-gather per microbatch); True frees it after each forward, for memory. An EP rank's experts
    are FSDP's over the ranks holding the same experts (``mesh.experts_mesh``), or, where none
    shares them, left out of FSDP and held whole."""
    apply_tp(module, plan, mesh.tp_mesh)
    if mesh.experts_mesh is not None:  # the experts sharded over the ranks holding the same ones
        shard_experts(module, mesh.experts_mesh, reshard_after_forward)
    # one EP rank's experts whole: not FSDP's
    ignored = {p for p in module.parameters() if is_expert(p) and not isinstance(p, DTensor)} or None
    for block in _own_blocks(stage_blocks(module)):
        fully_shard(block, mesh=mesh.dp_mesh, reshard_after_forward=reshard_after_forward,
                    shard_placement_fn=fsdp_placement, ignored_params=ignored)
    fully_shard(module, mesh=mesh.dp_mesh, reshard_after_forward=reshard_after_forward, shard_placement_fn=fsdp_placement,
                ignored_params=ignored)
    for sub in fsdp_modules(module):
        sub.set_force_sum_reduction_for_comms(True)  # SUM collectives (with a factor: no PREMUL_SUM)
        sub.set_gradient_divide_factor(1.0)  # and no division: reduce_grad divides once
    return module


def fsdp_modules(module: nn.Module) -> list[FSDPModule]:
    """Every FSDP group's module inside ``module`` (the root last)."""
    return [m for m in reversed(list(module.modules())) if isinstance(m, FSDPModule)]


class Gather:
    """The all-gathers :func:`unshard` started for one stage; :func:`wait` completes them."""

    def __init__(self, handles: list) -> None:
        self.handles = handles


def unshard(stage: nn.Module) -> Gather:
    """Start gathering every FSDP group of ``stage`` (asynchronous all-gathers)."""
    return Gather([h for m in fsdp_modules(stage) if (h := m.unshard(async_op=True)) is not None])


def wait(gather: Optional[Gather]) -> None:
    """Wait for the all-gathers of :func:`unshard` (a no-op for None: nothing was started)."""
    if gather is not None:
        for handle in gather.handles:
            handle.wait()
        gather.handles = []


def reshard(stage: nn.Module) -> None:
    """Free the gathered parameters of every FSDP group of ``stage``."""
    for m in fsdp_modules(stage):
        m.reshard()


def no_sync_backward(stage: FSDPModule) -> None:
    """Before each backward (``B``, ``I`` or ``W``) of ``stage``: no reduction, gradients
    accumulate unsharded, parameters stay gathered (torch's ``backward_maybe_with_nosync``)."""
    stage.set_is_last_backward(False)
    stage.set_reshard_after_backward(False)
    stage.set_requires_gradient_sync(False)


def gradient_divisor(layout: ParallelLayout, microbatches: int) -> int:
    """What a step's summed gradients are divided by when each microbatch's loss is a mean over
    its own samples: every microbatch of every data-parallel rank (``tp`` ranks share data).
    A caller that already scales each microbatch's loss by ``1/microbatches`` (the StageRunner
    does) passes ``microbatches=1``: the count is divided once, wherever it is divided."""
    return microbatches * layout.dp_replicate * layout.dp_shard


@torch.no_grad()
def reduce_grad(stage: FSDPModule, divisor: float) -> None:
    """The stage's ``REDUCE_GRAD``: reduce its accumulated gradients (SUM) into the sharded
    parameters' ``.grad`` and divide them once by ``divisor`` (torch's ``perform_reduce_grad``
    followed by its ``scale_grads``)."""
    stage.set_is_last_backward(True)
    stage.set_reshard_after_backward(True)
    stage.set_requires_gradient_sync(True)
    state = fully_shard.state(stage)
    for each in state._state_ctx.all_states:
        for group in each._fsdp_param_groups:
            group.post_backward()
    state._root_post_backward_final_callback()
    scale_grads(stage.parameters(), divisor)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A sharded tensor gathered whole (collective over its mesh: every rank holding a piece calls
    it), a plain tensor as it is. DTensor logs a warning per rank for a tensor-parallel shard
    sharded again by FSDP (two all-gathers in sequence, "may give inconsistent results ... due to
    different reduction orders"): an all-gather reduces nothing, so it is kept out of the terminal."""
    if not isinstance(t, DTensor):
        return t
    redistribute_log = logging.getLogger("torch.distributed.tensor._redistribute")
    level = redistribute_log.level
    redistribute_log.setLevel(logging.ERROR)
    try:
        return t.full_tensor()
    finally:
        redistribute_log.setLevel(level)


@contextmanager
def outputs_left_unmodified() -> Iterator[None]:
    """A sharded stage's forward, without FSDP2's warning that the stage returned a view: it warns
    that an in-place op on that view would skip the pre-backward hook, and the engine applies
    none to a stage's output (it detaches what it sends and scales the loss out of place)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor", category=UserWarning)
        yield


def local_tensors(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor's local piece (a DTensor's, else the tensor itself): what this rank's memory holds."""
    return [getattr(t, "_local_tensor", t) for t in tensors]


def shard_stages(stages: dict, mesh: ShardedMesh, plan: Optional[Plan], reshard_after_forward: bool,
                 exclude: Callable[[Iterable[torch.Tensor]], None]) -> dict:
    """Shard every stage of this rank (:func:`shard_stage`, by the model's tensor-parallel ``plan``);
    returns each stage's :class:`StageSharding`, which divides its
    reduced gradients by the data-parallel degree (the runner already scales each microbatch's
    loss by ``1/m``: :func:`gradient_divisor` with one microbatch)."""
    if mesh.layout.tp > 1 and not plan:
        raise ConfigError(f"tensor parallelism (tp={mesh.layout.tp}) needs a plan: StagedModel(..., tp_plan=plan_for(...))")
    divisor = gradient_divisor(mesh.layout, 1)
    return {s: StageSharding(shard_stage(stage, mesh, plan or {}, reshard_after_forward), divisor, exclude)
            for s, stage in stages.items()}


class StageSharding:
    """A sharded stage's part in its rank's program (a :class:`~..engine.stage_runner.StagePart`): the all-gathers ``UNSHARD`` starts and the
    stage's next compute waits for, ``RESHARD``, gradient sync off before every backward, and the
    ``REDUCE_GRAD`` that reduce-scatters and divides once by ``divisor``. The gathered
    parameters are excluded from the activation meter (``exclude``): they are weights, not
    activations, however long autograd keeps them."""

    def __init__(self, stage: FSDPModule, divisor: float, exclude: Callable[[Iterable[torch.Tensor]], None]) -> None:
        self.stage, self.divisor, self.exclude = stage, divisor, exclude
        self._gather: Optional[Gather] = None

    def unshard(self) -> None:
        self._gather = unshard(self.stage)

    def ready(self) -> None:
        """Before a compute: the stage's parameters gathered (waits for the UNSHARD ahead)."""
        if self._gather is not None:
            wait(self._gather)
            self._gather = None
            self.exclude(local_tensors(self.stage.parameters()))

    def forward(self) -> AbstractContextManager:
        """Around the stage's forward (recomputed ones included): :func:`outputs_left_unmodified`."""
        return outputs_left_unmodified()

    @contextmanager
    def backward(self) -> Iterator[None]:
        """Around each backward: the parameters gathered, gradient sync off (:func:`no_sync_backward`)."""
        self.ready()
        no_sync_backward(self.stage)
        yield

    def reshard(self) -> None:
        self.ready()  # a gather still in flight completes before its memory is freed
        reshard(self.stage)

    def reduce_grad(self) -> None:
        reduce_grad(self.stage, self.divisor)


def scale_grads(params: Iterable[nn.Parameter], divisor: float) -> None:
    """Divide every gradient of ``params`` by ``divisor``."""
    if divisor != 1:
        for p in params:
            if p.grad is not None:
                p.grad.div_(divisor)
