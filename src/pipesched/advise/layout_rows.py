"""A layout's rows: each candidate of its group's schedule search priced for every member.

:mod:`.layout_search` searches a group's schedules once (members share ``pp``, ``tp`` and ``dp``,
so compute and activations); this module turns each simulated candidate, while its simulation is
at hand (:attr:`~.result.Candidate.priced`, so no schedule is built twice), into one row per
member with that member's state, gathers and reductions (:mod:`.sharded_step`) and its per-rank
peak. A member's rows are then the best fitting candidate of every family, and each family
without one is named with why: a verdict from every candidate of the member, never from a part.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Sequence

from ..memory import format_bytes
from ..parallel_layout import ParallelLayout
from ..simulate import SimResult
from .estimate import GB
from .fabric import Fabric
from .held_gradients import gradient_intervals, peak_with_gradients
from .layout import LayoutCandidate
from .layout_costs import LayoutCosts
from .result import Candidate
from .sharded_step import layout_step


def pricer(members: Sequence[tuple[ParallelLayout, LayoutCosts]], fabric: Fabric, replica_latency: float):
    """The search's ``price`` hook for a group: a candidate and its simulation -> one row per member."""
    def price(c: Candidate, result: SimResult) -> tuple[LayoutCandidate, ...]:
        return tuple(priced_row(layout, costs, c, result, fabric, replica_latency) for layout, costs in members)
    return price


def priced_row(layout: ParallelLayout, costs: LayoutCosts, c: Candidate, result: SimResult, fabric: Fabric,
               replica_latency: float) -> LayoutCandidate:
    """One member's row: the simulated pipeline with its collectives and its own bytes."""
    schedule = result.schedule
    member = replace(costs, layer_assignment=c.layer_assignment) if c.layer_assignment else costs
    step = layout_step(result.timeline, member.gathered_bytes_per_stage(schedule.stages, schedule.style),
                       member.reduced_bytes_per_stage(schedule.stages, schedule.style), layout, fabric,
                       c.microbatches, replica_latency, units=max(member.layers_per_stage(schedule.stages, schedule.style)),
                       zero1=member.precision.zero1)
    peaks = _rank_peaks(layout, member, result)
    held = [{**b.to_json(), "activations": a, "peak": p}
            for b, a, p in zip(member.ranks_bytes(schedule.stages, schedule.style), result.peak_memory_bytes, peaks)]
    peak = max(peaks)
    budget = member.budget_bytes()
    own = replace(c, peak_memory_bytes=peak, memory_gb=peak / GB, fits=budget is None or peak <= budget, priced=())
    return LayoutCandidate(layout.pp, layout.dp_replicate, own, step.step_time, step.exposed_reduce, step.reduce_per_rank,
                           tp=layout.tp, dp_shard=layout.dp_shard, exposed_gather=step.exposed_gather,
                           gather_per_rank=step.gather_per_rank, bytes_per_rank=tuple(held),
                           pipeline_bubble=1 - max(result.busy) / result.makespan, ep=costs.ep)


def member_rows(index: int, candidates: Iterable[Candidate], families: Sequence[str],
                skipped: Sequence[tuple[str, int, int, str]]) -> tuple[list[LayoutCandidate], list[str]]:
    """The ``index``-th member's best fitting row of each family (fastest first), and for each
    family without one, why: the leanest candidate's bytes, or why none was built."""
    rows = [c.priced[index] for c in candidates if c.priced]
    best: dict[str, LayoutCandidate] = {}
    leanest: dict[str, LayoutCandidate] = {}
    for row in rows:
        name = row.candidate.schedule
        if row.candidate.fits:
            if name not in best or _order(row) < _order(best[name]):
                best[name] = row
        elif name not in leanest or row.candidate.peak_memory_bytes < leanest[name].candidate.peak_memory_bytes:
            leanest[name] = row
    why = []
    for name in families:
        if name in best:
            continue
        if name in leanest:
            need = leanest[name].candidate.peak_memory_bytes
            why.append(f"{name} does not fit (its leanest, {leanest[name].candidate.label()}, needs {format_bytes(need)})")
        else:
            reasons = sorted({reason for family, _, _, reason in skipped if family == name})
            why.append(f"{name}: {'; '.join(reasons) if reasons else 'not built'}")
    return sorted(best.values(), key=_order), why


def _order(row: LayoutCandidate) -> tuple:
    return (row.step_time, row.candidate.peak_memory_bytes or 0.0, row.candidate.chunks)


def _rank_peaks(layout: ParallelLayout, member: LayoutCosts, result: SimResult) -> list[float]:
    """Each rank's peak bytes: its state plus its activations; with FSDP under pipelining the
    unsharded gradients are summed on the timeline (:mod:`.held_gradients`), not at the peak
    (ZeRO-1's gradient buffer is held the whole step: :attr:`LayoutCosts.grads_on_timeline`)."""
    schedule = result.schedule
    state = member.state_bytes(schedule.stages, schedule.style)
    if not member.grads_on_timeline:
        return [a + s for a, s in zip(result.peak_memory_bytes, state)]
    grads = member.reduced_bytes_per_stage(schedule.stages, schedule.style)
    peaks = []
    for rank, constant in enumerate(state):
        held = gradient_intervals(result.timeline[rank], grads)
        rest = constant - sum(size for _, _, size in held)
        peaks.append(rest + peak_with_gradients(result.memory_curve(rank, in_bytes=True), held))
    return peaks


def how_searched(microbatches: str, why: Sequence[str]) -> str:
    """How a member was searched: in full, at which microbatch counts, and the families it lacks."""
    return f"in full at {microbatches}" + (f"; {'; '.join(why)}" if why else "")
