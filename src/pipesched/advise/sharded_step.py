"""A simulated step with the data-parallel collectives of a whole layout on each rank's comm lane.

The pipeline's timeline (the simulator's, compute and TP's collectives on the compute lane)
gains, per rank, a communication lane that runs beside compute:

- **FSDP's all-gathers** (``dp_shard > 1``): with a pipeline, each local stage's parameters are
  gathered once per step, issued back to back from the step's start in the order the stages are
  first used (torch's lowering issues ``UNSHARD`` ahead of a stage's first action). A gather that
  ends after its stage's first action delays it; the step is charged the largest such delay of
  any rank (exact for rank 0, whose first action is at time 0 and which every other rank waits
  for; an upper bound for the others, whose wait may hide in their warm-up);
- **the gradient reductions**: at each stage's ``REDUCE_GRAD`` (its last ``B`` or ``W``) a
  reduce-scatter over ``dp_shard`` then, with replicas, an all-reduce of the shard over
  ``dp_replicate`` (HSDP; torch's ``DDP`` bucketing: :class:`~.layout.AllReduceCost`), one stage
  after another, as :func:`~.layout.gradient_sync` places them;
- **without a pipeline** (``pp == 1``) FSDP reshards each block after its forward: every
  microbatch gathers the whole model twice (forward, backward) and reduce-scatters it once; that
  traffic overlaps the microbatches' compute and only what outlasts it, plus the first block's
  gather and the last block's reduction (nothing to overlap them with), is exposed.

Ring times and link classes come from :mod:`.fabric`.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import Sequence

from ..execution import Span
from ..parallel_layout import ParallelLayout
from .fabric import Fabric, all_gather_time, reduce_scatter_time
from .layout import AllReduceCost, gradient_sync


@dataclass(frozen=True)
class ShardedReduction:
    """A stage's gradient reduction: reduce-scatter over the shards, then the shard's all-reduce
    over the replicas (``time`` of the unsharded gradient bytes, as :func:`gradient_sync` asks)."""

    layout: ParallelLayout
    fabric: Fabric
    replica_latency: float = 0.0
    units: int = 1  # FSDP units (blocks) of a stage: one reduce-scatter each

    def time(self, nbytes: float) -> float:
        shards, replicas = self.layout.dp_shard, self.layout.dp_replicate
        link = self.fabric.link(self.layout, "dp_shard")
        scatter = self.units * reduce_scatter_time(shards, nbytes / self.units, link)
        link = self.fabric.link(self.layout, "dp_replicate")
        return scatter + AllReduceCost(replicas, link.bandwidth, self.replica_latency).time(nbytes / shards)


@dataclass(frozen=True)
class LayoutStep:
    """One step of a layout: compute, TP on the compute lane, FSDP and replicas on the comm lane."""

    step_time: float  # ms
    exposed_gather: float  # ms the step waited for all-gathers
    exposed_reduce: float  # ms of reduction that outlasted compute
    gather_per_rank: float  # ms of all-gathers on the busiest rank's lane, hidden or not
    reduce_per_rank: float  # ms of reductions on the busiest rank's lane, hidden or not
    lane: tuple[tuple[tuple[str, int, float, float], ...], ...]  # per rank: (AG|RS, stage, start, end)


def gather_times(gathered: Sequence[float], layout: ParallelLayout, fabric: Fabric, units: int = 1) -> list[float]:
    """Each stage's all-gather on a rank's comm lane, ms: ``units`` blocks of its ``gathered`` bytes."""
    link = fabric.link(layout, "dp_shard")
    return [units * all_gather_time(layout.dp_shard, b / units, link) for b in gathered]


def layout_step(timeline: Sequence[Sequence[Span]], gathered: Sequence[float], reduced: Sequence[float],
                layout: ParallelLayout, fabric: Fabric, microbatches: int, replica_latency: float = 0.0,
                units: int = 1, zero1: bool = False) -> LayoutStep:
    """The step of ``timeline`` (one pipeline's simulated spans per rank) with its layout's
    data-parallel collectives; ``gathered`` / ``reduced``: bytes each stage all-gathers and
    reduces; ``units``: FSDP units (blocks) of a stage, each gathered and reduced by a collective
    of its own (each paying the ring's latencies; see the module doc); ``zero1``: Megatron's
    distributed optimizer, whose weights stay whole without a pipeline too (gathered once a step)."""
    gather = gather_times(gathered, layout, fabric, units)
    reduction = ShardedReduction(layout, fabric, replica_latency, units)
    if layout.pp == 1 and layout.dp_shard > 1 and not zero1:
        return _without_pipeline(timeline[0], gather[0], reduction.time(reduced[0]), microbatches, units)
    lanes, delay = [], 0.0
    for spans in timeline:
        stages = list(map(itemgetter(0), map(itemgetter(0), spans)))  # each stage's first span, in C loops
        first_use = {stage: spans[stages.index(stage)].start for stage in dict.fromkeys(stages)}
        free, mine = 0.0, []
        for stage, used in sorted(first_use.items(), key=lambda kv: kv[1]):
            if gather[stage] > 0:
                mine.append(("AG", stage, free, free + gather[stage]))
                delay = max(delay, free + gather[stage] - used)
                free += gather[stage]
        lanes.append(mine)
    synced = gradient_sync(timeline, reduced, reduction, shift=delay)
    lane = tuple(tuple(g) + tuple(("RS", st, a, b) for st, a, b in r) for g, r in zip(lanes, synced.reduce_spans))
    return LayoutStep(synced.step_time, delay, synced.exposed, _busiest(lane, "AG"), _busiest(lane, "RS"), lane)


def _busiest(lane, kind: str) -> float:
    return max((sum(e - s for k, _, s, e in spans if k == kind) for spans in lane), default=0.0)


def _without_pipeline(spans: Sequence[Span], gather: float, reduce: float, microbatches: int, units: int) -> LayoutStep:
    """FSDP alone (see the module doc): ``gather`` / ``reduce`` are the whole model's, in ``units`` blocks."""
    compute = max((s.end for s in spans), default=0.0)
    gathers, reductions = 2 * microbatches * gather, microbatches * reduce
    first_gather, last_reduce = gather / units, reduce / units  # nothing to overlap them with
    beyond = max(0.0, gathers + reductions - compute)  # traffic that outlasts the compute it overlaps
    lane = ((("AG", 0, 0.0, gathers), ("RS", 0, gathers, gathers + reductions)),)
    return LayoutStep(compute + first_gather + beyond + last_reduce, first_gather + beyond, last_reduce,
                      gathers, reductions, lane)
