"""The 2D process mesh of data x pipeline parallelism: D replicas of one P-stage pipeline.

The world of ``P x D`` processes is arranged by ``torch.distributed.device_mesh.init_device_mesh``
with dims ``("dp", "pp")``, ``pp`` the inner (fastest-varying) one: global rank ``g`` is pipeline
rank ``g % P`` of replica ``g // P``. Launchers number ranks node by node (torchrun gives each
node consecutive global ranks), so with ``P`` dividing the processes per node a whole pipeline
sits on one node: the point-to-point traffic of every microbatch stays on the fast intra-node
links, and only the gradient all-reduce, once per step and overlapped with the pipeline's tail,
crosses nodes.

A runtime without a mesh (``PipelineMesh.whole_world()``) is the whole world as one pipeline,
as before data parallelism existed.

Every group of a mesh is created with the run's ``timeout_s``, so that no collective of a step
(its start, the loss's all-reduce, the replicas' gradient mean) waits longer for a silent rank,
whatever timeout the default group was created with (gloo's default is 30 minutes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist

from ...errors import ConfigError
from ...parallel_layout import runtime_layout
from .expert_mesh import init_expert_mesh


@dataclass(frozen=True)
class PipelineMesh:
    """Where this process sits: its pipeline (``pp``) and data-parallel (``dp``) coordinates and groups.

    ``pp_group`` holds the ranks of this process's pipeline; ``dp_group`` the ranks that hold
    the same stages in the other replicas (None when ``dp == 1``); ``world_group`` every rank
    (the step's start and the agreements of :mod:`.agreement`). ``grid[d][p]`` is the global
    rank of pipeline rank ``p`` in replica ``d``, as torch's device mesh lays them out."""

    pp: int
    dp: int
    pp_rank: int
    dp_rank: int
    pp_group: Any
    dp_group: Optional[Any]
    grid: tuple[tuple[int, ...], ...]
    world_group: Any = None
    all_grids: tuple = ()  # with tensor parallelism: the pipelines of every tp coordinate (grid among them)
    data_group: Any = None  # sharded stages: the data-parallel ranks here (dp_group is None: FSDP reduces)
    experts: Any = None  # with expert parallelism: this rank's ExpertMesh (.expert_mesh)

    @property
    def replicas_group(self) -> Any:
        """The ranks that hold this pipeline position for the other shares of the batch (what the
        step's loss is averaged over), whether they reduce gradients with this rank or FSDP does."""
        return self.data_group if self.data_group is not None else self.dp_group

    @property
    def grids(self) -> tuple:
        """Every grid whose pipelines groups are made over: a group takes the whole world to make,
        so every rank makes the groups of every tensor-parallel coordinate's pipelines."""
        return self.all_grids or (self.grid,)

    @staticmethod
    def whole_world(timeout_s: Optional[float] = None) -> "PipelineMesh":
        """Every rank as one pipeline, no replicas (collective: creates its group)."""
        return init_pipeline_mesh(dist.get_world_size(), 1, timeout_s)

    def global_rank(self, pp_rank: int) -> int:
        """The global rank of pipeline rank ``pp_rank`` in this process's replica."""
        return self.grid[self.dp_rank][pp_rank]

    def merge_on(self, dst: int, local: dict) -> Optional[dict]:
        """Every pipeline rank's ``local`` dict merged on global rank ``dst`` (None elsewhere);
        replicas hold the same values, so only the pipeline ``dst`` belongs to takes part."""
        if dst not in self.grid[self.dp_rank]:
            return None
        parts = [None] * self.pp if dist.get_rank() == dst else None
        dist.gather_object(local, parts, dst=dst, group=self.pp_group)
        if parts is None:
            return None
        merged: dict = {}
        for part in parts:
            merged.update(part)
        return merged

    def shard(self, batch: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """This replica's contiguous share of the global ``batch`` (dim 0)."""
        if batch is None or self.dp == 1:
            return batch
        if batch.shape[0] % self.dp:
            raise ConfigError(f"the batch of {batch.shape[0]} does not split into {self.dp} equal replica shards")
        return batch.chunk(self.dp)[self.dp_rank]


def check_timeout(timeout_s: Optional[float]) -> Optional[timedelta]:
    """``timeout_s`` as a timedelta (None: the default group's); ConfigError unless it is a
    finite number of seconds above 0."""
    if timeout_s is None:
        return None
    number = isinstance(timeout_s, (int, float)) and not isinstance(timeout_s, bool)
    if not (number and math.isfinite(timeout_s) and 0 < timeout_s <= 365 * 86400):
        raise ConfigError(f"timeout_s must be a finite number of seconds above 0 (at most a year), got {timeout_s!r}")
    return timedelta(seconds=timeout_s)


def init_pipeline_mesh(pp: int, dp: int, timeout_s: Optional[float] = None, ep: int = 1) -> PipelineMesh:
    """Arrange the initialised world as ``dp`` replicas of a ``pp``-rank pipeline (see module doc),
    each group bounded by ``timeout_s`` (None: the default group's timeout), the replicas' ranks
    of each stage splitting its routed experts ``ep`` ways (:mod:`.expert_mesh`). Collective.

    Global rank ``g`` is pipeline rank ``g % pp`` of replica ``g // pp``, the layout of
    ``init_device_mesh(..., (dp, pp), mesh_dim_names=("dp", "pp"))``; the groups are made
    directly, which lets them carry the timeout (on gloo and NCCL alike)."""
    world = dist.get_world_size()
    timeout = check_timeout(timeout_s)
    if pp < 1 or dp < 1:
        raise ConfigError(f"pipeline ranks and data-parallel replicas must be at least 1, got pp={pp} dp={dp}")
    if world != pp * dp:
        raise ConfigError(f"{world} processes cannot form {dp} replicas of a {pp}-rank pipeline: need {pp * dp}")
    layout = runtime_layout(pp, dp, ep=ep)  # refuses an ep that does not divide dp
    rank = dist.get_rank()
    grid = tuple(tuple(d * pp + p for p in range(pp)) for d in range(dp))
    world_group = dist.new_group(list(range(world)), timeout=timeout)
    if dp == 1:
        return PipelineMesh(pp, 1, rank, 0, world_group, None, grid, world_group)
    pp_groups = [dist.new_group(list(row), timeout=timeout) for row in grid]
    dp_groups = [dist.new_group([row[p] for row in grid], timeout=timeout) for p in range(pp)]
    return PipelineMesh(pp, dp, rank % pp, rank // pp, pp_groups[rank // pp], dp_groups[rank % pp], grid, world_group,
                        experts=init_expert_mesh(layout, (grid,), timeout))
