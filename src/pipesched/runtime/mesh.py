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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

from ..errors import ConfigError

MESH_DIMS = ("dp", "pp")


@dataclass(frozen=True)
class PipelineMesh:
    """Where this process sits: its pipeline (``pp``) and data-parallel (``dp``) coordinates and groups.

    ``pp_group`` holds the ranks of this process's pipeline; ``dp_group`` the ranks that hold
    the same stages in the other replicas (None when ``dp == 1``). ``grid[d][p]`` is the global
    rank of pipeline rank ``p`` in replica ``d``, as the device mesh lays them out."""

    pp: int
    dp: int
    pp_rank: int
    dp_rank: int
    pp_group: Any
    dp_group: Optional[Any]
    grid: tuple[tuple[int, ...], ...]

    @staticmethod
    def whole_world() -> "PipelineMesh":
        """The default group as one pipeline, no replicas."""
        world = dist.get_world_size()
        return PipelineMesh(world, 1, dist.get_rank(), 0, dist.group.WORLD, None, (tuple(range(world)),))

    def global_rank(self, pp_rank: int) -> int:
        """The global rank of pipeline rank ``pp_rank`` in this process's replica."""
        return self.grid[self.dp_rank][pp_rank]

    def shard(self, batch: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """This replica's contiguous share of the global ``batch`` (dim 0)."""
        if batch is None or self.dp == 1:
            return batch
        if batch.shape[0] % self.dp:
            raise ConfigError(f"the batch of {batch.shape[0]} does not split into {self.dp} equal replica shards")
        return batch.chunk(self.dp)[self.dp_rank]


def init_pipeline_mesh(pp: int, dp: int) -> PipelineMesh:
    """Arrange the initialised world as ``dp`` replicas of a ``pp``-rank pipeline (see module doc).

    The mesh is a CPU one over gloo (also when ranks share a GPU over gloo: a CUDA mesh would
    assign each rank a device of its own), a CUDA one over NCCL."""
    world = dist.get_world_size()
    if pp < 1 or dp < 1:
        raise ConfigError(f"pipeline ranks and data-parallel replicas must be at least 1, got pp={pp} dp={dp}")
    if world != pp * dp:
        raise ConfigError(f"{world} processes cannot form {dp} replicas of a {pp}-rank pipeline: need {pp * dp}")
    if dp == 1:
        return PipelineMesh.whole_world()
    from torch.distributed.device_mesh import init_device_mesh

    device_type = "cpu" if dist.get_backend() == "gloo" else "cuda"
    mesh = init_device_mesh(device_type, (dp, pp), mesh_dim_names=MESH_DIMS)
    grid = tuple(tuple(row) for row in mesh.mesh.tolist())
    return PipelineMesh(
        pp, dp, mesh.get_local_rank("pp"), mesh.get_local_rank("dp"), mesh.get_group("pp"), mesh.get_group("dp"), grid
    )
