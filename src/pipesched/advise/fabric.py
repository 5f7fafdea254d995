"""The network a layout runs on: two link classes, and ring collectives priced on them.

GPUs sit in nodes of ``gpus_per_node``; ranks are numbered node by node (torchrun's order). A
process group whose ranks all share a node talks over the node's links (NVLink: ``within``),
any other over the network between nodes (``across``). Which class a layout's dimension uses
follows from :meth:`~pipesched.parallel_layout.ParallelLayout.group_of` and the layout's order:
the innermost dimensions land inside a node.

Collectives are rings over ``n`` ranks (NCCL's algorithm for large messages, the one that
bounds bandwidth): an all-gather or a reduce-scatter of a tensor of ``N`` bytes (its full,
gathered size) moves ``(n-1)/n x N`` bytes through each rank's link in ``n-1`` steps, each
paying the link's latency; an all-reduce is a reduce-scatter then an all-gather. Bandwidths
are in bytes per millisecond, latencies in milliseconds (the advisor's time unit).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..errors import ConfigError
from ..parallel_layout import ParallelLayout
from .estimate import GB

WITHIN, ACROSS = "within a node", "across nodes"


@dataclass(frozen=True)
class Link:
    """One link class: ``bandwidth`` in bytes per ms, ``latency`` in ms per ring step."""

    bandwidth: float
    latency: float = 0.0

    @classmethod
    def from_gbps(cls, gb_per_s: float, latency_ms: float = 0.0) -> "Link":
        """A link of ``gb_per_s`` GB/s (1 GB = 1e9 bytes), as the command line gives it."""
        return cls(gb_per_s * GB / 1e3, latency_ms)

    def __post_init__(self) -> None:
        if not (self.bandwidth > 0 and self.bandwidth < float("inf")) or not 0 <= self.latency < float("inf"):
            raise ConfigError(f"a link needs a bandwidth above 0 and a latency of at least 0, got {self}")


@lru_cache(maxsize=4096)
def _spans_nodes(gpus_per_node: int, layout: ParallelLayout, dimension: str) -> bool:
    """:meth:`Fabric.spans_nodes`, remembered: a search prices every collective of every
    candidate on each member's links, and a group of 128 ranks of a 16,384-GPU layout costs
    its coordinates each time (most of a whole-layout search's pricing, unremembered)."""
    return len({rank // gpus_per_node for rank in layout.group_of(0, dimension)}) > 1


def all_gather_time(n: int, nbytes: float, link: Link) -> float:
    """Ring all-gather of a tensor of ``nbytes`` (gathered size) over ``n`` ranks, ms."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) * link.latency + (n - 1) / n * nbytes / link.bandwidth


def reduce_scatter_time(n: int, nbytes: float, link: Link) -> float:
    """Ring reduce-scatter of a tensor of ``nbytes`` (unsharded size) over ``n`` ranks, ms: the
    all-gather's steps and volume, run backwards."""
    return all_gather_time(n, nbytes, link)


def all_to_all_time(n: int, nbytes: float, link: Link) -> float:
    """All-to-all over ``n`` ranks of a buffer of ``nbytes`` per rank, ms: ``n-1`` pairwise steps,
    each a latency and the ``n``-th of the buffer that goes to one peer."""
    return all_gather_time(n, nbytes, link)


def all_reduce_time(n: int, nbytes: float, link: Link) -> float:
    """Ring all-reduce of ``nbytes`` over ``n`` ranks: a reduce-scatter, then an all-gather, ms."""
    return reduce_scatter_time(n, nbytes, link) + all_gather_time(n, nbytes, link)


@dataclass(frozen=True)
class Fabric:
    """Nodes of ``gpus_per_node`` GPUs, ``within`` a node and ``across`` nodes."""

    gpus_per_node: int
    within: Link
    across: Link

    def __post_init__(self) -> None:
        if isinstance(self.gpus_per_node, bool) or not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 1:
            raise ConfigError(f"GPUs per node must be a whole number of at least 1, got {self.gpus_per_node!r}")

    def spans_nodes(self, layout: ParallelLayout, dimension: str) -> bool:
        """Whether ``dimension``'s process groups reach past one node (every group of a
        dimension has the same shape, so rank 0's answers for all)."""
        return _spans_nodes(self.gpus_per_node, layout, dimension)

    def link(self, layout: ParallelLayout, dimension: str) -> Link:
        """The link class ``dimension``'s collectives (or, for ``pp``, its sends) run on."""
        return self.across if self.spans_nodes(layout, dimension) else self.within

    def expert_link(self, layout: ParallelLayout, ep: int) -> Link:
        """The link expert parallelism's all-to-alls run on: EP takes ``ep`` of a stage's
        data-parallel ranks, innermost first (``dp_shard``'s, then ``dp``'s: torchtitan's
        convention), so its group spans ``ep x tp`` consecutive GPUs."""
        shard, replicas = layout.group_of(0, "dp_shard"), layout.group_of(0, "dp_replicate")
        group = sorted(a + b for b in replicas for a in shard)[:ep]
        return self.across if len({rank // self.gpus_per_node for rank in group}) > 1 else self.within

    def link_name(self, layout: ParallelLayout, dimension: str) -> str:
        return ACROSS if self.spans_nodes(layout, dimension) else WITHIN
