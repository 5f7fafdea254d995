"""Whole stages: plain modules, each held whole by its rank; replicas all-reduce (as DDP does).

A tied weight held by two stages of a rank is one ``Parameter``, each stage's share of its
gradient summed apart (:mod:`..engine.tied_sums`); the reduction plan's all-reduces span every
replica and divide by their count; with clipping, the loss agreement's one all-reduce over the
pipeline also sums the gradients' squares (:mod:`..comm.agree`), and torch's own
``clip_grads_with_norm_`` scales them; without clipping the norm (for the metrics) is summed
over the world from the first replica's gradients (:mod:`..comm.grad_norm`).
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional, Sequence

import torch
from torch import nn

from ...parallel_layout import runtime_layout
from ..comm import tied
from ..comm.grad_norm import pieces_norm
from ..comm.mesh import PipelineMesh
from ..engine.tied_sums import TiedSums, WholeStage, whole_parts
from ..stages.staged_model import StagedModel
from .base import StageStrategy


class WholeStages(StageStrategy):
    """Whole stages over ``mesh``'s pipelines and replicas (``device``: this rank's, where NCCL reduces)."""

    def __init__(self, mesh: PipelineMesh, device: torch.device) -> None:
        self.mesh, self.device = mesh, device
        self.layout = runtime_layout(mesh.pp, mesh.dp, ep=mesh.experts.ep if mesh.experts else 1)
        # the agreement sums one replica's squares: expert replicas hold other experts (grad_norm's pieces)
        self.norm_in_agreement = mesh.experts is None
        self.sums: Optional[TiedSums] = None  # the rank's tied weights held on several stages

    @property
    def replicas_reduced(self) -> int:
        return self.mesh.dp

    def tie(self, stages: dict[int, nn.Module], tied_groups: Sequence[Sequence[str]]) -> None:
        tied.share_on_rank(stages, tied_groups)

    def lay_out(self, stages: dict[int, nn.Module], model: StagedModel, options,
                exclude: Callable[[Iterable[torch.Tensor]], None]) -> dict[int, WholeStage]:
        self.split_experts(stages, model)
        self.sums = TiedSums(stages, model.tied)
        return whole_parts(stages, self.sums)

    def start_step(self) -> None:
        self.sums.clear()  # a step cut short by an error left its sums

    def grad_norm(self, counted: Sequence[nn.Parameter], agreed: Optional[float]) -> float:
        if agreed is not None:
            return agreed
        return pieces_norm(counted, {"dp": self.mesh.dp_rank}, self.mesh.world_group, self.device)

    def clip(self, params: Sequence[nn.Parameter], max_norm: float, norm: float) -> None:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, torch.tensor(norm, dtype=torch.float64))
