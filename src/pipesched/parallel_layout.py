"""How a world of processes is cut: pipeline stages x data-parallel replicas x shards x tensor parallelism.

A :class:`ParallelLayout` names the four dimensions torchtitan puts on one device mesh:

- ``pp``: pipeline ranks (each holds some stages);
- ``dp_replicate``: whole replicas of the pipeline (gradients all-reduced between them);
- ``dp_shard``: FSDP shards inside a stage (parameters, gradients and optimizer state split
  ``dp_shard`` ways, gathered for compute, gradients reduce-scattered);
- ``tp``: tensor parallelism inside each layer (attention heads and MLP columns split ``tp`` ways).

The world is their product. ``ep`` (expert parallelism) is no fifth dimension: as in
torchtitan it borrows ranks from the data-parallel ones (``dp_replicate x dp_shard``), which it
divides; the routed experts of each MoE layer are split ``ep`` ways over consecutive data
indices (:meth:`ParallelLayout.expert_groups`).

``order`` lists the dimensions outermost first; the last one varies
fastest with the global rank, so it lands on ranks a launcher puts on one node (torchrun numbers
ranks node by node). torchtitan's order, the default, puts ``tp`` innermost (every layer's
all-reduces on the fast links of a node) and ``pp`` outermost (only one activation per microbatch
crosses nodes).

This module is pure (no torch): the planner, the advisor and the command line check a layout
before any rank starts; the runtime builds its process groups from the same coordinates.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Optional

from .errors import ConfigError

DIMENSIONS = ("pp", "dp_replicate", "dp_shard", "tp")
TORCHTITAN_ORDER = DIMENSIONS  # outermost first: pp, then replicas, then shards, tp innermost
# the runtime's order (pipesched.runtime.sharding.sharded_mesh says why): replicas outermost, tp innermost
RUNTIME_ORDER = ("dp_replicate", "dp_shard", "pp", "tp")


@dataclass(frozen=True)
class ParallelLayout:
    """``pp x dp_replicate x dp_shard x tp`` processes, laid out in ``order`` (outermost first)."""

    pp: int
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    order: tuple[str, ...] = TORCHTITAN_ORDER
    ep: int = 1

    def __post_init__(self) -> None:
        for name in (*DIMENSIONS, "ep"):
            size = getattr(self, name)
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise ConfigError(f"the layout's {name} must be a whole number of at least 1, got {size!r}")
        if sorted(self.order) != sorted(DIMENSIONS):
            raise ConfigError(f"the layout's order must name each of {', '.join(DIMENSIONS)} once, got {list(self.order)}")
        if self.dp % self.ep:
            raise ConfigError(f"expert parallelism ep={self.ep} does not divide the {self.dp} data-parallel ranks "
                              f"(dp x dp_shard) it borrows its ranks from")

    @property
    def world(self) -> int:
        """How many processes the layout needs."""
        return prod(self.sizes().values())

    @property
    def dp(self) -> int:
        """Data-parallel degree: how many ways each global batch is split (replicas x shards)."""
        return self.dp_replicate * self.dp_shard

    @property
    def sharded(self) -> bool:
        """Whether stages are split inside (FSDP shards or tensor parallelism)."""
        return self.dp_shard > 1 or self.tp > 1

    @property
    def expert_shards(self) -> int:
        """How many ranks FSDP shards each EP rank's experts over: where ``ep`` divides ``dp_shard``,
        the ``dp_shard / ep`` ranks of one replica holding the same experts (torchtitan's "efsdp";
        the replicas, ``dp_replicate``, hold the same shards: HSDP); else 1, each rank holding its
        experts whole (no ``dp_shard``, or an EP group spanning replicas). Without ``ep`` the experts
        are parameters like the others (FSDP shards them with the rest): 1."""
        sharded = self.ep > 1 and self.dp_shard > self.ep and self.dp_shard % self.ep == 0
        return self.dp_shard // self.ep if sharded else 1

    def expert_groups(self, data_index: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The data indices (``dp_replicate`` coordinate x ``dp_shard`` + ``dp_shard`` coordinate)
        that split the experts with ``data_index`` (its EP group: ``ep`` consecutive ones, inside one
        replica's shards first, as torchtitan borrows from ``dp_shard``), and those that hold the
        same experts as it (one per EP group: whose expert gradients are reduced together)."""
        first = data_index - data_index % self.ep
        return (tuple(range(first, first + self.ep)),
                tuple(range(data_index % self.ep, self.dp, self.ep)))

    def sizes(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in DIMENSIONS}

    def coordinates(self, rank: int) -> dict[str, int]:
        """Global ``rank``'s coordinate along each dimension (the last of ``order`` varies fastest)."""
        if not 0 <= rank < self.world:
            raise ConfigError(f"rank {rank} is outside a layout of {self.world} processes")
        coords = {}
        for name in reversed(self.order):
            size = getattr(self, name)
            coords[name] = rank % size
            rank //= size
        return coords

    def rank(self, **coords: int) -> int:
        """The global rank at ``coords`` (every dimension named)."""
        rank = 0
        for name in self.order:
            rank = rank * getattr(self, name) + coords[name]
        return rank

    def group_of(self, rank: int, dimension: str) -> tuple[int, ...]:
        """The global ranks that differ from ``rank`` only along ``dimension`` (its process group)."""
        coords = self.coordinates(rank)
        return tuple(self.rank(**{**coords, dimension: i}) for i in range(getattr(self, dimension)))

    def check(self, world: Optional[int] = None, *, heads: Optional[int] = None, kv_heads: Optional[int] = None,
              hidden: Optional[int] = None) -> None:
        """Refuse (one line, :class:`ConfigError`) a layout that cannot run: a product other than
        the ``world`` size, ``tp`` not dividing the attention heads, key-value heads or hidden size."""
        if world is not None and self.world != world:
            raise ConfigError(f"the layout {self} needs {self.world} processes, not {world}")
        for what, count in (("attention heads", heads), ("key-value heads", kv_heads), ("hidden size", hidden)):
            if count is not None and count % self.tp:
                raise ConfigError(f"tensor parallelism tp={self.tp} does not divide the model's {count} {what}")

    def __str__(self) -> str:
        cut = " x ".join(f"{name} {getattr(self, name)}" for name in self.order)
        return cut + (f" (ep {self.ep})" if self.ep > 1 else "")


def runtime_layout(pp: int, dp_replicate: int = 1, dp_shard: int = 1, tp: int = 1, ep: int = 1) -> ParallelLayout:
    """The layout a run's processes take, in the runtime's order (the placement ``--dp`` runs
    have): the one builder of ``train``'s layout (``--ranks``, ``--dp``, ``--dp-shard``, ``--tp``, ``--ep``)."""
    return ParallelLayout(pp, dp_replicate, dp_shard, tp, order=RUNTIME_ORDER, ep=ep)
