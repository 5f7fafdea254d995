"""Sharded stages: FSDP2 and tensor parallelism inside each stage (:mod:`..sharding`).

A tied weight held by two stages of a rank is one copy per stage (:mod:`..comm.tied_copies`:
FSDP2 makes each stage's parameters its own groups'); each stage is sharded as torchtitan does
and its part in the program gathers, frees and reduce-scatters
(:class:`~..sharding.sharding.StageSharding`); FSDP reduced the data-parallel ranks' gradients
already, so the reduction plan's all-reduces span one replica's holders; the gradient norm is
summed from every rank's pieces over the whole world (:mod:`..comm.grad_norm`) and clipping
scales each piece (:mod:`..sharding.sharded_norm`); under tensor parallelism the first update
checks that no gradient the plan leaves replicated is partial (:mod:`..sharding.tp_guard`).
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional, Sequence

import torch
from torch import nn

from ..comm import tied
from ..comm.grad_norm import pieces_norm
from ..sharding.sharded_mesh import ShardedMesh
from ..sharding.sharded_norm import clip_local
from ..sharding.sharding import StageSharding, shard_stages
from ..sharding.tp_guard import TpGuard
from ..stages.staged_model import StagedModel
from .base import StageStrategy


class ShardedStages(StageStrategy):
    """Sharded stages over ``sharded`` (``device``: this rank's, where NCCL reduces)."""

    norm_in_agreement = False
    replicas_reduced = 1

    def __init__(self, sharded: ShardedMesh, device: torch.device) -> None:
        self.sharded, self.device = sharded, device
        self.mesh, self.layout = sharded.pipeline, sharded.layout
        self.tp_rank, self.shard_rank = sharded.tp_rank, sharded.shard_rank
        self.guard = TpGuard(sharded, device)  # checks the first update's gradients under tp

    def tie(self, stages: dict[int, nn.Module], tied_groups: Sequence[Sequence[str]]) -> None:
        tied.share_on_rank(stages, tied_groups, per_stage=True)

    def lay_out(self, stages: dict[int, nn.Module], model: StagedModel, options,
                exclude: Callable[[Iterable[torch.Tensor]], None]) -> dict[int, StageSharding]:
        self.split_experts(stages, model)
        return shard_stages(stages, self.sharded, model.tp_plan, options.reshard_after_forward, exclude)

    def grad_norm(self, counted: Sequence[nn.Parameter], agreed: Optional[float]) -> float:
        coordinates = {"dp_replicate": self.sharded.replicate_rank, "dp_shard": self.shard_rank, "tp": self.tp_rank}
        return pieces_norm(counted, coordinates, self.mesh.world_group, self.device)

    def clip(self, params: Sequence[nn.Parameter], max_norm: float, norm: float) -> None:
        clip_local(params, max_norm, norm)

    def before_update(self, named: Iterable[tuple[str, nn.Parameter]]) -> None:
        self.guard.before_update(named)
