"""The chart of a whole layout's pick: its pipeline's actions with each rank's comm lane under them."""

from __future__ import annotations

from ..parallel_layout import ParallelLayout
from ..registry import build_schedule, get_family
from ..render.timeline import Timeline
from ..simulate import simulate
from .estimate import TransformerCosts
from .fabric import Fabric
from .layout import LayoutCandidate
from .layout_costs import LayoutCosts
from .search import objective_option
from .sharded_step import layout_step


def whole_layout_timeline(best: LayoutCandidate, model: TransformerCosts, fabric: Fabric,
                          replica_latency: float) -> Timeline:
    """``best``'s pipeline as simulated, shifted by the gathers it waited for, with the all-gathers
    and gradient reductions of :func:`~.sharded_step.layout_step` on each rank's comm lane."""
    c = best.candidate
    layout = ParallelLayout(best.pp, best.dp, best.dp_shard, best.tp)
    costs = LayoutCosts.for_layout(model, layout, fabric)
    if c.layer_assignment:
        costs = costs.with_layer_assignment(c.layer_assignment)
    schedule = build_schedule(c.schedule, best.pp, c.microbatches, c.chunks, c.costs, c.memory_limit,
                              **objective_option(get_family(c.schedule), c.objective or "makespan"))
    result = simulate(schedule, c.costs)
    step = layout_step(result.timeline, costs.gathered_bytes_per_stage(schedule.stages, schedule.style),
                       costs.reduced_bytes_per_stage(schedule.stages, schedule.style), layout, fabric,
                       c.microbatches, replica_latency, units=max(costs.layers_per_stage(schedule.stages, schedule.style)))
    shifted = tuple(tuple(s._replace(start=s.start + step.exposed_gather, end=s.end + step.exposed_gather) for s in spans)
                    for spans in result.timeline)
    return Timeline(shifted, schedule.placement, name=f"{schedule.describe()}, {layout}", unit="ms", comm=step.lane)
