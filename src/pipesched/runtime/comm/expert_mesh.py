"""The process groups of expert parallelism: who exchanges tokens, who holds the same experts.

Expert parallelism borrows its ranks from the data-parallel ones (torchtitan's convention,
:meth:`pipesched.parallel_layout.ParallelLayout.expert_groups`): at one pipeline position (and
tensor-parallel coordinate) the ranks of data indices ``g x ep .. g x ep + ep - 1`` split each
MoE layer's routed experts ``ep`` ways and exchange tokens with ``all_to_all`` (the *EP group*);
the ranks at the same place in the other EP groups hold the same experts, and only they sum those
experts' gradients (the *expert replicas*). Every group is made by every rank, in one order, with
the run's timeout (as :mod:`.mesh` makes its own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

from ...parallel_layout import ParallelLayout


@dataclass(frozen=True)
class ExpertMesh:
    """This rank's place in expert parallelism: ``ep_rank`` of ``ep`` in ``ep_group`` (its experts are
    the ``ep_rank``-th ``1/ep`` of each layer's), and ``replica_index`` among the ``replicas`` ranks
    holding the same experts (``replicas_group``: None when it is this rank alone)."""

    ep: int
    ep_rank: int
    ep_group: Any
    replica_index: int
    replicas: int
    replicas_group: Optional[Any]


def init_expert_mesh(layout: ParallelLayout, grids: tuple, timeout) -> Optional[ExpertMesh]:
    """The expert groups of ``layout`` (None when ``ep`` is 1); ``grids[t][d][p]``: the global rank of
    data index ``d`` at pipeline rank ``p`` and tensor-parallel coordinate ``t``. Collective."""
    if layout.ep == 1:
        return None
    me, mine = dist.get_rank(), {}
    for grid in grids:
        for p in range(layout.pp):
            sets = {layout.expert_groups(d) for d in range(layout.dp)}
            for kind, position in (("ep", 0), ("replicas", 1)):
                for indices in sorted({s[position] for s in sets}):
                    ranks = [grid[d][p] for d in indices]
                    group = dist.new_group(ranks, timeout=timeout) if len(ranks) > 1 else None
                    if me in ranks:
                        mine[kind] = (group, ranks.index(me), len(ranks))
    (ep_group, ep_rank, _), (replicas_group, replica_index, replicas) = mine["ep"], mine["replicas"]
    return ExpertMesh(layout.ep, ep_rank, ep_group, replica_index, replicas, replicas_group)


def is_expert(p) -> bool:
    """Whether ``p`` is one EP rank's experts (a parameter :mod:`..sharding.expert_parallel` kept,
    marked with its ``expert_replica``: this rank's index among the ranks holding the same experts)."""
    return hasattr(p, "expert_replica")


def pieces_mesh(mesh: ExpertMesh, held: Optional[Any], device_type: str) -> Any:
    """The DeviceMesh a checkpoint wraps this rank's experts over (:mod:`..checkpoints.checkpoint_pieces`):
    the EP group (1-D) where each rank holds its experts whole; where FSDP shards them over
    ``held`` (``experts_mesh``, its last dim ``expert_shard``), the 2-D ``(ep, expert_shard)`` of
    this replica, so ``[Shard(0), Shard(0)]`` places each rank's rows in the whole layer: the
    ``ep_rank``-th ``1/ep``, then its shard's ``torch.chunk`` of that. Collective over the EP group."""
    from torch.distributed.device_mesh import DeviceMesh

    if held is None:
        return DeviceMesh.from_group(mesh.ep_group, device_type)
    row = held.mesh if held.ndim == 1 else held.mesh[held.get_local_rank("expert_replicate")]
    rows = [None] * mesh.ep
    dist.all_gather_object(rows, (mesh.ep_rank, row.tolist()), group=mesh.ep_group)
    grid = torch.tensor([r for _, r in sorted(rows)])
    column = grid[:, held.get_local_rank("expert_shard")]
    if sorted(column.tolist()) != sorted(dist.get_process_group_ranks(mesh.ep_group)):
        raise ValueError(f"the EP group {dist.get_process_group_ranks(mesh.ep_group)} is not a column of "
                         f"the expert shards' grid {grid.tolist()}")
    return DeviceMesh.from_group([mesh.ep_group, held.get_group("expert_shard")], device_type, mesh=grid,
                                 mesh_dim_names=("ep", "expert_shard"))
