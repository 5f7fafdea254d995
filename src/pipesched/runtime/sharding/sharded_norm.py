"""Gradient clipping over sharded stages: the whole model's gradient norm from every rank's pieces.

After ``REDUCE_GRAD`` a rank holds a piece of each of its stages' gradients (a DTensor's local
tensor): its FSDP shard (``dp_shard``), its tensor-parallel piece where the plan splits the
weight (``tp``), the same piece as every replica (``dp_replicate``) and, where the plan leaves a
weight whole (norms, embeddings), the same whole tensor as every ``tp`` rank. Each element of the
model is counted once: a piece along each mesh dimension it is sharded over, and along each
dimension it is replicated over (or its DTensor's mesh leaves out) only at coordinate 0; each parameter only on the pipeline rank
the reduction plan counts it on (:attr:`~pipesched.runtime.comm.reduction.ReductionPlan.counted`:
DualPipe's copies and tied weights once). One all-reduce of one float64 over the whole world
sums the squares. Clipping then scales every local piece by torch's coefficient
(``clip_grads_with_norm_``: ``max_norm / (norm + 1e-6)``, at most 1), the copies of tied weights
no optimizer steps included, so every gradient read by name is the clipped one.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate

from .sharded_mesh import ShardedMesh


def _counted_here(p: nn.Parameter, coordinates: dict[str, int]) -> bool:
    """Whether this rank, at ``coordinates`` along the position's mesh dimensions, counts ``p``'s
    local piece: at coordinate 0 of every dimension the piece is replicated over, whether its
    mesh says so (``Replicate``) or leaves the dimension out (a weight tensor parallelism leaves
    whole is FSDP's DTensor over the data dimensions only; a plain tensor is replicated everywhere)."""
    replicated = dict(coordinates)
    if isinstance(p, DTensor):
        mesh = p.device_mesh
        for name, c, placement in zip(mesh.mesh_dim_names, mesh.get_coordinate(), p.placements):
            replicated[name] = c if isinstance(placement, Replicate) else 0
    return all(c == 0 for c in replicated.values())


@torch.no_grad()
def global_grad_norm(counted: Iterable[nn.Parameter], mesh: ShardedMesh, device: torch.device) -> float:
    """The whole model's gradient norm (collective over every rank of every pipeline; ``device``:
    this rank's, where NCCL reduces)."""
    coordinates = {"dp_replicate": mesh.replicate_rank, "dp_shard": mesh.shard_rank, "tp": mesh.tp_rank}
    world_group = mesh.pipeline.world_group
    squares = torch.zeros((), dtype=torch.float64)
    for p in counted:
        if p.grad is not None and _counted_here(p, coordinates):
            squares += getattr(p.grad, "_local_tensor", p.grad).double().pow(2).sum().cpu()
    squares = squares.to("cpu" if dist.get_backend(world_group) == "gloo" else device)
    dist.all_reduce(squares, group=world_group)
    return float(squares) ** 0.5


@torch.no_grad()
def clip_local(params: Iterable[nn.Parameter], max_norm: float, norm: float) -> None:
    """Scale every gradient piece of ``params`` as torch's ``clip_grads_with_norm_`` would the whole."""
    coefficient = min(max_norm / (norm + 1e-6), 1.0)
    for p in params:
        if p.grad is not None:
            getattr(p.grad, "_local_tensor", p.grad).mul_(coefficient)
