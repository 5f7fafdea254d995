"""The whole model's gradient norm from every rank's pieces of its gradients: one rule for the
metrics' norm and for clipping's, whatever the layout.

A rank holds, of each parameter it counts, either the whole gradient (whole stages, the
one-process model) or a piece of it (a DTensor's local tensor, on sharded stages): its FSDP
shard (``dp_shard``), its tensor-parallel piece where the plan splits the weight (``tp``), the
same piece as every replica (``dp_replicate``, or ``dp`` on whole stages) and, where the plan
leaves a weight whole (norms, embeddings), the same whole tensor as every ``tp`` rank. Each
element of the model is counted once: a piece along each mesh dimension it is sharded over,
and along each dimension it is replicated over (or its DTensor's mesh leaves out) only at
coordinate 0 (an expert-parallel rank's experts: at its expert replica 0 and tp coordinate 0); each parameter only on the pipeline rank the reduction plan counts it on
(:attr:`~.reduction.ReductionPlan.counted`: DualPipe's copies and tied weights once). Squares
are summed in float64 from the pieces as they are (no gather), then all-reduced once.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate

from .expert_mesh import is_expert


def counted_here(p: nn.Parameter, coordinates: Optional[Mapping[str, int]]) -> bool:
    """Whether this rank, at ``coordinates`` along the layout's data and tensor dimensions, counts
    ``p``'s local piece: at coordinate 0 of every dimension the piece is replicated over, whether its
    mesh says so (``Replicate``) or leaves the dimension out (a weight tensor parallelism leaves
    whole is FSDP's DTensor over the data dimensions only; a plain tensor is replicated everywhere)."""
    replicated = dict(coordinates or {})
    if is_expert(p):  # one EP rank's experts: a piece, the same on its expert replicas and tp ranks
        return p.expert_replica == 0 and replicated.get("tp", 0) == 0
    if isinstance(p, DTensor):
        mesh = p.device_mesh
        for name, c, placement in zip(mesh.mesh_dim_names, mesh.get_coordinate(), p.placements):
            replicated[name] = c if isinstance(placement, Replicate) else 0
    return all(c == 0 for c in replicated.values())


@torch.no_grad()
def local_squares(params: Iterable[nn.Parameter], coordinates: Optional[Mapping[str, int]] = None) -> torch.Tensor:
    """This rank's share of the squared gradient norm (float64, on the gradients' device): the
    squares of the pieces of ``params`` it counts at ``coordinates`` (none given: every piece)."""
    squares = [getattr(p.grad, "_local_tensor", p.grad).detach().double().pow(2).sum()
               for p in params if p.grad is not None and counted_here(p, coordinates)]
    return torch.stack(squares).sum() if squares else torch.zeros((), dtype=torch.float64)


def pieces_norm(params: Iterable[nn.Parameter], coordinates: Optional[Mapping[str, int]] = None, group: Any = None,
              device: Optional[torch.device] = None) -> float:
    """The gradient norm of ``params`` over every rank of ``group`` (None: this process alone),
    each element counted once (:func:`counted_here`); collective over ``group``. Call it once the
    step's gradients are reduced. Gloo reduces host memory, NCCL ``device``'s."""
    squares = local_squares(params, coordinates)
    if group is not None:
        squares = squares.to("cpu" if dist.get_backend(group) == "gloo" else device)
        dist.all_reduce(squares, group=group)
    return float(squares) ** 0.5
