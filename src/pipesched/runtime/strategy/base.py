"""The interface of a runtime's stage strategy: what differs between whole and sharded stages.

One strategy per runtime (:func:`~pipesched.runtime.strategy.choose_strategy`). Where it acts, in
the order the runtime is built and a step runs:

1. :meth:`~StageStrategy.tie`: a tied weight on several stages of this rank becomes one
   ``Parameter`` (whole) or one copy per stage (sharded: FSDP2 makes each stage's parameters
   its own groups');
2. :meth:`~StageStrategy.lay_out`: each stage's :class:`~..engine.stage_runner.StagePart`
   (``UNSHARD``, ``RESHARD``, ``REDUCE_GRAD``, what wraps a forward and a backward), sharding
   the stages where they are sharded;
3. :attr:`~StageStrategy.replicas_reduced`: how many replicas each all-reduce of the reduction
   plan (:mod:`..comm.reduction`) spans and divides by;
4. :meth:`~StageStrategy.start_step`, then, with clipping, :attr:`~StageStrategy.norm_in_agreement`
   and :meth:`~StageStrategy.grad_norm` (the whole model's norm), :meth:`~StageStrategy.clip`;
   :meth:`~StageStrategy.before_update` checks the gradients before the optimizer steps.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, Iterable, Optional, Sequence

import torch
from torch import nn

from ...errors import ConfigError
from ...parallel_layout import ParallelLayout
from ..comm.mesh import PipelineMesh
from ..engine.stage_runner import StagePart
from ..sharding.expert_parallel import split_experts
from ..stages.staged_model import StagedModel


class StageStrategy(ABC):
    """How this rank's stages are laid out, and what follows from it. ``mesh``: the pipeline's
    mesh (its ranks, replicas and groups); ``layout``: the whole run's; ``tp_rank`` and
    ``shard_rank``: this rank's coordinates along tensor parallelism and FSDP's shards."""

    mesh: PipelineMesh
    layout: ParallelLayout
    tp_rank: int = 0
    shard_rank: int = 0
    norm_in_agreement: bool  # whether the loss agreement's all-reduce also sums the gradients' squares

    @property
    @abstractmethod
    def replicas_reduced(self) -> int:
        """How many replicas each all-reduce of the reduction plan spans (and divides by)."""

    @abstractmethod
    def tie(self, stages: dict[int, nn.Module], tied: Sequence[Sequence[str]]) -> None:
        """Share each tied group's parameter among the stages of this rank that hold it (:mod:`..comm.tied`)."""

    @abstractmethod
    def lay_out(self, stages: dict[int, nn.Module], model: StagedModel, options,
                exclude: Callable[[Iterable[torch.Tensor]], None]) -> dict[int, StagePart]:
        """Each stage's part in the program, after laying the stages out as the strategy holds
        them (``model``: their facts; ``options``: the runtime's; ``exclude``: the activation
        meter's, for weights)."""

    def split_experts(self, stages: dict[int, nn.Module], model: StagedModel) -> None:
        """With expert parallelism (the mesh's ``experts``), keep this rank's share of each MoE
        layer's routed experts (:mod:`..sharding.expert_parallel`), before the stages are laid out."""
        if self.mesh.experts is None:
            return
        if model.expert_plan is None:
            raise ConfigError("expert parallelism needs the model's experts: "
                              "StagedModel(..., expert_plan=expert_plan_for(...))")
        split_experts(stages, self.mesh.experts, model.expert_plan)

    def start_step(self) -> None:
        """Before a step's first action: forget what the last one left."""

    @abstractmethod
    def grad_norm(self, counted: Sequence[nn.Parameter], agreed: Optional[float]) -> float:
        """The whole model's gradient norm (collective): ``counted`` the reduction plan's
        parameters of this rank, ``agreed`` the loss agreement's norm (where it sums one; None:
        measured here, as the metrics do without clipping). Every layout's is
        :func:`~..comm.grad_norm.pieces_norm` of its pieces, each element once."""

    @abstractmethod
    def clip(self, params: Sequence[nn.Parameter], max_norm: float, norm: float) -> None:
        """Scale the gradients of ``params`` as torch's ``clip_grads_with_norm_`` scales the whole model's."""

    def before_update(self, named: Iterable[tuple[str, nn.Parameter]]) -> None:
        """After the step's reductions, before its optimizer step: the gradients' checks (collective)."""
