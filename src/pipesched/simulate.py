"""The simulator: time and memory of a schedule under a cost model.

Times follow :mod:`pipesched.execution` (ranks in program order, asynchronous sends, a ``comm``
latency on cross-rank inputs). Memory counts activations: a stage-microbatch holds them from the
start of its ``F`` to the end of its ``W`` (or full ``B``). One unit is one microbatch's
activations for a rank's whole share of the model (the Zero Bubble paper's M_B), so a stage on a
rank holding ``k`` stages weighs ``1/k``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Optional

from .costs import UNIT, Costs
from .execution import Program, Span, pair_durations, run
from .placement import stages_by_rank
from .schedule import Schedule
from .validate import UNIT_RUN, VALIDATED, check_structure, lowered


@dataclass(frozen=True)
class SimResult:
    """What a schedule costs: the timeline and its metrics.

    - ``makespan``: wall time, all ranks starting at 0 (iterations synchronise at the optimizer).
    - ``span``: max over ranks of last end minus first start (the period when iterations overlap).
    - ``bubble_ratio``: ``1 - sum(busy) / (ranks * makespan)``.
    - ``busy[r]``: compute time of rank r; ``peak_memory[r]``: its peak activations in M_B.
    - ``timeline[r]``: rank r's spans (action, start, end) in program order.
    """

    schedule: Schedule
    costs: Costs
    makespan: float
    span: float
    bubble_ratio: float
    busy: tuple[float, ...]
    peak_memory: tuple[float, ...]
    _program: Program = field(repr=False, compare=False)
    _starts: list = field(repr=False, compare=False)
    _ends: list = field(repr=False, compare=False)

    @cached_property
    def timeline(self) -> tuple[tuple[Span, ...], ...]:
        acts, starts, ends = self._program.actions, self._starts, self._ends
        return tuple(
            tuple(Span(acts[i], starts[i], ends[i]) for i in ids) for ids in self._program.rank_ids
        )

    @property
    def max_peak_memory(self) -> float:
        return max(self.peak_memory)

    def memory_curve(self, rank: int) -> list[tuple[float, float]]:
        """(time, activations held) steps for one rank, in M_B units, starting at (0, 0)."""
        weight = 1.0 / _stages_on_rank(self.schedule)[rank]
        events: list[tuple[float, int, float]] = []
        for span in self.timeline[rank]:
            if span.action.kind == "F":
                events.append((span.start, 1, weight))
            elif span.action.kind in "WB":
                events.append((span.end, 0, -weight))
        events.sort()
        level = 0.0
        curve = [(0.0, 0.0)]
        for time, _order, delta in events:
            level += delta
            curve.append((time, max(level, 0.0)))
        return curve

    def metrics(self) -> dict:
        """The metrics as plain numbers (what ``simulate --json`` prints)."""
        return {
            "schedule": self.schedule.name,
            "ranks": self.schedule.ranks,
            "microbatches": self.schedule.microbatches,
            "chunks": self.schedule.chunks,
            "makespan": self.makespan,
            "span": self.span,
            "bubble_ratio": self.bubble_ratio,
            "busy": list(self.busy),
            "peak_memory": list(self.peak_memory),
        }


def _stages_on_rank(schedule: Schedule) -> list[int]:
    return [max(1, len(s)) for s in stages_by_rank(schedule.placement, schedule.ranks)]


def action_durations(schedule: Schedule, costs: Costs) -> dict[tuple[int, str], float]:
    """Duration of each (stage, kind) under ``costs`` for this schedule's placement."""
    return durations_for(schedule.placement, schedule.ranks, costs)


def durations_for(placement: tuple[int, ...], ranks: int, costs: Costs) -> dict[tuple[int, str], float]:
    """Duration of each (stage, kind) under ``costs`` for a stage-to-rank placement."""
    per_rank = [max(1, len(s)) for s in stages_by_rank(placement, ranks)]
    mults = costs.multipliers(len(placement))
    table = {}
    for s, rank in enumerate(placement):
        for kind in "FIWB":
            table[(s, kind)] = costs.kind_cost(kind) * mults[s] / per_rank[rank]
    return table


def durations_by_id(schedule: Schedule, program: Program, costs: Costs) -> list[float]:
    """Duration of every action of the lowered program, in id order (an overlapped pair's on
    its forward's id, priced by ``costs.overlap``)."""
    flat = action_durations(schedule, costs)
    table = [{kind: flat[(s, kind)] for kind in "FIWB"} for s in range(schedule.stages)]
    durations = [table[s][kind] for s, kind, _k in program.actions]
    return pair_durations(program, durations, costs.overlap) if schedule.overlapped else durations


def simulate(schedule: Schedule, costs: Optional[Costs] = None) -> SimResult:
    """Simulate ``schedule`` under ``costs`` (unit costs, no latency, by default).

    Raises ScheduleError for a malformed schedule and DeadlockError for one that cannot finish.
    """
    costs = costs or UNIT
    if not schedule.meta.get(VALIDATED):
        check_structure(schedule)
    program = lowered(schedule)
    cached = schedule.meta.get(UNIT_RUN) if costs == UNIT else None
    if cached is not None:
        durations, starts, ends = cached
    else:
        durations = durations_by_id(schedule, program, costs)
        starts, ends = run(program, durations, costs.comm)
    busy, peaks, first, last = [], [], [], []
    for ids, k in zip(program.rank_ids, _stages_on_rank(schedule)):
        busy.append(sum([durations[i] for i in ids]))
        peaks.append(_peak([program.actions[i][1] for i in ids]) / k)
        if ids:
            first.append(starts[ids[0]])
            last.append(ends[ids[-1]])
    makespan = max(last, default=0.0)
    span = max((e - s for s, e in zip(first, last)), default=0.0)
    bubble = 1.0 - sum(busy) / (schedule.ranks * makespan) if makespan > 0 else 0.0
    return SimResult(
        schedule=schedule,
        costs=costs,
        makespan=makespan,
        span=span,
        bubble_ratio=max(0.0, bubble),
        busy=tuple(busy),
        peak_memory=tuple(peaks),
        _program=program,
        _starts=starts,
        _ends=ends,
    )


def _peak(kinds: list[str]) -> int:
    """Peak count of stage-microbatches held on a rank (F adds one, W or B frees one)."""
    held = peak = 0
    for kind in kinds:
        if kind == "F":
            held += 1
            if held > peak:
                peak = held
        elif kind != "I":
            held -= 1
    return peak
