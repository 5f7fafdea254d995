"""Whole or sharded stages: one strategy, chosen once from the mesh, for everything that differs.

A rank's stages are either plain modules (each rank holds them whole; replicas all-reduce their
gradients, as DDP does) or sharded inside (FSDP2 and tensor parallelism: gathered before a
compute, freed after, reduce-scattered). What differs between the two is one
:class:`~.base.StageStrategy`, picked by :func:`choose_strategy` where the runtime is built, as
torchtitan picks a model's ``parallelize`` once; the executor and the stage runners call it and
test no mode:

- ``base``: the strategy's interface (tied weights, laying the stages out, the reductions' span,
  the gradient norm, clipping, the check before an update);
- ``whole``: plain modules (:class:`~.whole.WholeStages`);
- ``sharded``: FSDP2 / tensor parallelism (:class:`~.sharded.ShardedStages`).

Imports torch, the planning core, and of the runtime ``stages``, ``comm``, ``engine`` and ``sharding``.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from ..comm.mesh import PipelineMesh
from ..sharding.sharded_mesh import ShardedMesh
from .base import StageStrategy
from .sharded import ShardedStages
from .whole import WholeStages


def choose_strategy(mesh: Union[PipelineMesh, ShardedMesh, None], timeout_s: float, device: torch.device) -> StageStrategy:
    """Sharded stages on a :class:`~..sharding.sharded_mesh.ShardedMesh`, whole ones on a
    :class:`~..comm.mesh.PipelineMesh` (None: the whole world is one pipeline, ``timeout_s`` its groups')."""
    if isinstance(mesh, ShardedMesh):
        return ShardedStages(mesh, device)
    return WholeStages(mesh if mesh is not None else PipelineMesh.whole_world(timeout_s), device)


__all__ = ["StageStrategy", "choose_strategy"]
