"""Process groups of a :class:`~pipesched.parallel_layout.ParallelLayout`: a torch ``DeviceMesh``
over ``(dp_replicate, dp_shard, tp)`` for this rank's pipeline position, and its pipeline.

Where ranks sit is the layout's ``order`` (outermost first, the last varying fastest). The order
the runtime uses by default, :data:`~pipesched.parallel_layout.RUNTIME_ORDER` (built by
:func:`~pipesched.parallel_layout.runtime_layout`), is ``dp_replicate, dp_shard, pp, tp``:

- with ``dp_shard = tp = 1`` it is exactly the placement of :func:`.mesh.init_pipeline_mesh`
  (global rank ``g`` is pipeline rank ``g % pp`` of replica ``g // pp``), so an existing
  ``--dp`` run keeps its ranks, and a whole pipeline stays on one node as before;
- ``tp`` is innermost, as in torchtitan: its all-reduces, one per layer per microbatch, run on
  the fastest links.

torchtitan's own order (``pp`` outermost, :data:`~pipesched.parallel_layout.TORCHTITAN_ORDER`)
is a parameter away. Every group is made directly with ``dist.new_group`` and the run's timeout
(as :mod:`.mesh` does, on gloo and NCCL alike), each by every rank in one order, then handed to
``DeviceMesh.from_group``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from ...parallel_layout import ParallelLayout
from ..comm.expert_mesh import init_expert_mesh
from ..comm.mesh import PipelineMesh, check_timeout

MESH_DIMS = ("dp_replicate", "dp_shard", "tp")  # the device mesh of one pipeline position


@dataclass(frozen=True)
class ShardedMesh:
    """This rank's place in a sharded layout.

    ``device_mesh``: dims ``MESH_DIMS`` over the ranks at this rank's pipeline position (what
    ``parallelize_module`` and ``fully_shard`` take). ``pipeline``: a :class:`PipelineMesh`
    whose ``dp`` is the data-parallel degree (``dp_replicate x dp_shard``; ``tp`` ranks read the
    same data), ``dp_rank`` this rank's data index, ``pp_group`` its pipeline, ``grid`` the
    pipelines of its ``tp`` coordinate (``grid[data index][pp rank]``), and ``dp_group`` the
    replicas' group only when nothing is sharded (then FSDP does no reduction; the existing
    all-reduce does). ``grids[t]`` is the grid of ``tp`` coordinate ``t``: a group over pipelines
    must be created by every rank, over every ``tp`` coordinate's pipelines."""

    layout: ParallelLayout
    device_mesh: DeviceMesh
    pipeline: PipelineMesh
    grids: tuple[tuple[tuple[int, ...], ...], ...]
    tp_rank: int
    shard_rank: int
    replicate_rank: int
    experts_mesh: Optional[DeviceMesh] = None  # FSDP's mesh for this rank's experts (layout.expert_shards > 1)

    @property
    def dp_mesh(self) -> DeviceMesh:
        """What ``fully_shard`` shards over: ``dp_shard``, or ``(dp_replicate, dp_shard)`` (HSDP)."""
        if self.layout.dp_replicate > 1:
            return self.device_mesh["dp_replicate", "dp_shard"]
        return self.device_mesh["dp_shard"]

    @property
    def tp_mesh(self) -> DeviceMesh:
        return self.device_mesh["tp"]


def _grid(layout: ParallelLayout, tp_rank: int) -> tuple[tuple[int, ...], ...]:
    """``grid[data index][pp rank]`` of the pipelines at ``tp_rank``; data index ``r * dp_shard + s``."""
    return tuple(
        tuple(layout.rank(pp=p, dp_replicate=r, dp_shard=s, tp=tp_rank) for p in range(layout.pp))
        for r in range(layout.dp_replicate) for s in range(layout.dp_shard)
    )


def _groups_along(layout: ParallelLayout, dimension: str, timeout) -> Any:
    """Make every group along ``dimension`` (collective, one order on every rank); return this rank's."""
    me = dist.get_rank()
    mine = None
    for members in sorted({layout.group_of(g, dimension) for g in range(layout.world)}):
        group = dist.new_group(list(members), timeout=timeout)
        if me in members:
            mine = group
    return mine


def _data_group(layout: ParallelLayout, timeout) -> Any:
    """Make every group of ranks that differ only in their data index (replica and shard); return
    this rank's (collective, one order on every rank)."""
    me, mine = dist.get_rank(), None
    members_of = set()
    for g in range(layout.world):
        c = layout.coordinates(g)
        members_of.add(tuple(sorted(layout.rank(**{**c, "dp_replicate": r, "dp_shard": s})
                                    for r in range(layout.dp_replicate) for s in range(layout.dp_shard))))
    for members in sorted(members_of):
        group = dist.new_group(list(members), timeout=timeout)
        if me in members:
            mine = group
    return mine


def init_sharded_mesh(layout: ParallelLayout, timeout_s: Optional[float] = None,
                      device_type: str = "cpu") -> ShardedMesh:
    """Arrange the initialised world as ``layout`` (see module doc), every group bounded by
    ``timeout_s`` (None: the default group's). Collective: every rank calls it with the same layout."""
    timeout = check_timeout(timeout_s)
    world = dist.get_world_size()
    layout.check(world)
    rank = dist.get_rank()
    coords = layout.coordinates(rank)
    world_group = dist.new_group(list(range(world)), timeout=timeout)
    groups = {name: _groups_along(layout, name, timeout) for name in ("pp", *MESH_DIMS)}
    data_group = _data_group(layout, timeout) if layout.dp_replicate > 1 and layout.dp_shard > 1 else (
        groups["dp_shard"] if layout.dp_shard > 1 else groups["dp_replicate"])
    at_position = torch.tensor([[[layout.rank(pp=coords["pp"], dp_replicate=r, dp_shard=s, tp=t)
                                  for t in range(layout.tp)] for s in range(layout.dp_shard)]
                                for r in range(layout.dp_replicate)])
    device_mesh = DeviceMesh.from_group([groups[name] for name in MESH_DIMS], device_type, mesh=at_position,
                                        mesh_dim_names=MESH_DIMS)
    data_rank = coords["dp_replicate"] * layout.dp_shard + coords["dp_shard"]
    replicas_only = not layout.sharded and layout.dp_replicate > 1
    pipeline = PipelineMesh(
        pp=layout.pp, dp=layout.dp, pp_rank=coords["pp"], dp_rank=data_rank, pp_group=groups["pp"],
        dp_group=groups["dp_replicate"] if replicas_only else None, grid=_grid(layout, coords["tp"]),
        world_group=world_group, all_grids=tuple(_grid(layout, t) for t in range(layout.tp)), data_group=data_group,
    )
    pipeline = replace(pipeline, experts=init_expert_mesh(layout, pipeline.all_grids, timeout))
    grids = pipeline.all_grids
    return ShardedMesh(layout, device_mesh, pipeline, grids, coords["tp"], coords["dp_shard"], coords["dp_replicate"],
                       _experts_mesh(layout, grids, device_type, timeout))


def _experts_mesh(layout: ParallelLayout, grids: tuple, device_type: str, timeout) -> Optional[DeviceMesh]:
    """FSDP's mesh for this rank's experts (None: held whole, ``layout.expert_shards`` 1): the ranks
    holding the same experts as it, ``(dp_replicate, expert_shards)`` of them (the data indices
    of one replica's shards consecutive, ``ParallelLayout.expert_groups``), 1-D without replicas.
    Collective: every rank makes every group, in one order."""
    shards, replicas = layout.expert_shards, layout.dp_replicate
    if shards == 1:
        return None
    me, mine = dist.get_rank(), {}
    for grid in grids:
        for p in range(layout.pp):
            for indices in sorted({layout.expert_groups(d)[1] for d in range(layout.dp)}):
                held = torch.tensor([grid[d][p] for d in indices]).view(replicas, shards)
                lines = {"expert_shard": held.tolist(), "expert_replicate": held.T.tolist() if replicas > 1 else []}
                for name, groups in lines.items():
                    for ranks in groups:
                        group = dist.new_group(ranks, timeout=timeout)
                        if me in ranks:
                            mine[name], mine["held"] = group, held
    if replicas == 1:
        return DeviceMesh.from_group(mine["expert_shard"], device_type, mesh_dim_names=("expert_shard",))
    return DeviceMesh.from_group([mine["expert_replicate"], mine["expert_shard"]], device_type, mesh=mine["held"],
                                 mesh_dim_names=("expert_replicate", "expert_shard"))
