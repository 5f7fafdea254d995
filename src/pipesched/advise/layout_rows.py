"""A layout's rows: each candidate of its group's schedule search priced for every member.

:mod:`.layout_search` searches a group's schedules once (members share ``pp``, ``tp`` and ``dp``,
so compute and activations); this module turns each simulated candidate, while its simulation is
at hand (:attr:`~.result.Candidate.priced`, so no schedule is built twice), into one row per
member with that member's state, gathers and reductions (:mod:`.sharded_step`) and its per-rank
peak. A member's rows are then the best fitting candidate of every family, and each family
without one is named with why: a verdict from every candidate of the member, never from a part.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Optional, Sequence

from ..memory import format_bytes
from ..parallel_layout import ParallelLayout
from ..simulate import SimResult
from .estimate import GB
from .fabric import Fabric
from .held_gradients import gradient_passes, peak_with_gradients
from .layout import LayoutCandidate
from .layout_costs import LayoutCosts
from .result import Candidate
from .sharded_step import layout_step


def pricer(members: Sequence[tuple[ParallelLayout, LayoutCosts]], fabric: Fabric, replica_latency: float):
    """The search's ``price`` hook for a group: a candidate and its simulation -> one row per member.

    A member's bytes depend on its candidate only through the stages' layers, so they are worked
    out once per (layer assignment, stages, placement) for the whole search; the simulation's
    activation curves and gradient passes are read once per candidate for all members
    (:class:`_HeldPeaks`). A group of many members at few microbatches (Llama 3 405B on 16,384
    GPUs) spent most of its search working them out again for every row."""
    shapes: dict[tuple, tuple[_MemberBytes, ...]] = {}

    def price(c: Candidate, result: SimResult) -> tuple[LayoutCandidate, ...]:
        schedule = result.schedule
        key = (c.layer_assignment or None, schedule.stages, schedule.style)
        if key not in shapes:
            shapes[key] = tuple(_member_bytes(replace(costs, layer_assignment=key[0]) if key[0] else costs, *key[1:])
                                for _, costs in members)
        held = _HeldPeaks(result)
        return tuple(priced_row(layout, costs.ep, mine, c, result, held, fabric, replica_latency)
                     for (layout, costs), mine in zip(members, shapes[key]))
    return price


@dataclass(frozen=True)
class _MemberBytes:
    """What a member's rows of one (layer assignment, stages, placement) are priced with."""

    gathered: tuple[float, ...]  # per stage: bytes all-gathered
    reduced: tuple[float, ...]  # per stage: gradient bytes reduced (unsharded)
    units: int  # FSDP units (blocks) of the fullest stage
    state: tuple[float, ...]  # per rank: state bytes
    ranks: tuple[dict, ...]  # per rank: its RankBytes' fields
    budget: Optional[float]
    grads_on_timeline: bool
    zero1: bool


def _member_bytes(member: LayoutCosts, stages: int, style: str) -> _MemberBytes:
    return _MemberBytes(tuple(member.gathered_bytes_per_stage(stages, style)),
                        tuple(member.reduced_bytes_per_stage(stages, style)),
                        max(member.layers_per_stage(stages, style)), tuple(member.state_bytes(stages, style)),
                        tuple(b.to_json() for b in member.ranks_bytes(stages, style)), member.budget_bytes(),
                        member.grads_on_timeline, member.precision.zero1)


def priced_row(layout: ParallelLayout, ep: int, mine: _MemberBytes, c: Candidate, result: SimResult,
               held: "_HeldPeaks", fabric: Fabric, replica_latency: float) -> LayoutCandidate:
    """One member's row: the simulated pipeline with its collectives and its own bytes."""
    step = layout_step(result.timeline, mine.gathered, mine.reduced, layout, fabric, c.microbatches, replica_latency,
                       units=mine.units, zero1=mine.zero1)
    peaks = _rank_peaks(mine, result, held)
    ranks = [{**b, "activations": a, "peak": p} for b, a, p in zip(mine.ranks, result.peak_memory_bytes, peaks)]
    peak = max(peaks)
    own = replace(c, peak_memory_bytes=peak, memory_gb=peak / GB, fits=mine.budget is None or peak <= mine.budget,
                  priced=())
    return LayoutCandidate(layout.pp, layout.dp_replicate, own, step.step_time, step.exposed_reduce, step.reduce_per_rank,
                           tp=layout.tp, dp_shard=layout.dp_shard, exposed_gather=step.exposed_gather,
                           gather_per_rank=step.gather_per_rank, bytes_per_rank=tuple(ranks),
                           pipeline_bubble=1 - max(result.busy) / result.makespan, ep=ep)


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


def _rank_peaks(mine: _MemberBytes, result: SimResult, held: "_HeldPeaks") -> list[float]:
    """Each rank's peak bytes: its state plus its activations; with FSDP under pipelining the
    unsharded gradients are summed on the timeline (:mod:`.held_gradients`), not at the peak
    (ZeRO-1's gradient buffer is held the whole step: :attr:`LayoutCosts.grads_on_timeline`)."""
    if not mine.grads_on_timeline:
        return [a + s for a, s in zip(result.peak_memory_bytes, mine.state)]
    return [constant - total + peak for constant, (total, peak) in zip(mine.state, held.of(mine.reduced))]


class _HeldPeaks:
    """One simulation's ranks under a stage's gradient bytes: per rank, the bytes of the gradients
    it holds at some time and its activations' peak with them on the timeline. Members of a group
    reduce the same gradients, so each set of bytes is summed on the timeline once per candidate."""

    def __init__(self, result: SimResult) -> None:
        self._result = result
        self._ranks: list[tuple[list, list]] = []  # per rank: its gradient passes and activation curve
        self._of: dict[tuple[float, ...], list[tuple[float, float]]] = {}

    def of(self, grads: tuple[float, ...]) -> list[tuple[float, float]]:
        """Per rank: (its held gradients' bytes, its activations' peak with them held)."""
        if not self._ranks:
            self._ranks = [(gradient_passes(spans), self._result.memory_steps(rank, in_bytes=True))
                           for rank, spans in enumerate(self._result.timeline)]
        if grads not in self._of:
            self._of[grads] = [_held_peak(curve, [(a, b, grads[s]) for a, b, s in passes])
                               for passes, curve in self._ranks]
        return self._of[grads]


def _held_peak(curve: tuple, intervals: list[tuple[float, float, float]]) -> tuple[float, float]:
    return sum(size for _, _, size in intervals), peak_with_gradients(*curve, intervals)


def how_searched(microbatches: str, why: Sequence[str]) -> str:
    """How a member was searched: in full, at which microbatch counts, and the families it lacks."""
    return f"in full at {microbatches}" + (f"; {'; '.join(why)}" if why else "")
