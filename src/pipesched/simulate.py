"""The simulator: time and memory of a schedule under a cost model.

Times follow :mod:`pipesched.execution` (ranks in program order, asynchronous sends, a ``comm``
latency on cross-rank inputs). Memory follows :mod:`pipesched.memory`: in M_B units a
stage-microbatch holds one microbatch's activations of a rank's share from the start of its ``F``
to the end of its ``W`` (or full ``B``), so a stage on a rank holding ``k`` stages weighs ``1/k``;
with per-stage sizes in bytes (``memory=``) it also reports peak bytes per rank, where ``I`` frees
all but the W stash and recomputed stages keep only their input. Recomputed stages re-run their
forward before their ``I`` or ``B``: that action takes ``F`` longer.

A schedule of several pipelines (DualPipe: two model copies, ``Schedule.pipelines``) keeps the
share at one model copy split over the ranks: each rank holds ``pipelines`` times those
parameters (``SimResult.parameter_copies``, counted apart from activations), and a stage on a rank
holding ``k`` stages weighs ``pipelines/k`` in time and activations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from itertools import repeat
from operator import itemgetter
from typing import Optional, Sequence

import numpy as np

from .collector import collector_paused
from .costs import UNIT, Costs, as_costs, durations_for, program_durations
from .errors import ConfigError
from .execution import Program, Span, run
from .lowering import KINDS
from .memory import MemorySizes, levels, rank_peaks, schedule_recompute, unit_rank_peaks, unit_sizes
from .ops import Op
from .placement import stages_by_rank
from .schedule import Schedule
from .validate import FINISHED, UNIT_RUN, check_structure, lowered


@dataclass(frozen=True)
class SimResult:
    """What a schedule costs: the timeline and its metrics.

    - ``makespan``: wall time, all ranks starting at 0 (iterations synchronise at the optimizer).
    - ``span``: max over ranks of last end minus first start (the period when iterations overlap).
    - ``bubble_ratio``: ``1 - sum(busy) / (ranks * makespan)``.
    - ``busy[r]``: compute time of rank r; ``peak_memory[r]``: its peak activations in M_B.
    - ``peak_memory_bytes[r]``: its peak activation bytes, when sizes were given (else None).
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
    peak_memory_bytes: Optional[tuple[float, ...]] = None
    memory: Optional[MemorySizes] = field(default=None, repr=False, compare=False)

    @cached_property
    @collector_paused()
    def timeline(self) -> tuple[tuple[Span, ...], ...]:
        acts, starts, ends = self._program.actions, self._starts, self._ends
        return tuple(  # made in C (tuple.__new__ over slices): a Python call per span costs seconds at p = 64, m = 512
            tuple(map(_new_tuple, repeat(Span), zip(acts[ids.start:ids.stop], starts[ids.start:ids.stop],
                                                    ends[ids.start:ids.stop])))
            for ids in self._program.rank_ids
        )

    @property
    def parameter_copies(self) -> int:
        """Parameters each rank holds, in one model copy's share per rank (DualPipe: 2)."""
        return self.schedule.pipelines

    @property
    def max_peak_memory(self) -> float:
        return max(self.peak_memory)

    def memory_curve(self, rank: int, in_bytes: bool = False) -> list[tuple[float, float]]:
        """(time, activations held) steps for one rank, starting at (0, 0): in M_B units, or in
        bytes (``in_bytes``, when sizes were given). A forward takes its memory when it starts,
        a backward gives it back when it ends (:meth:`memory_steps`, as pairs)."""
        return list(zip(*(steps.tolist() for steps in self.memory_steps(rank, in_bytes))))

    def memory_steps(self, rank: int, in_bytes: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`memory_curve`'s times and levels as two arrays, made without a Python step per
        action (the advisor reads every rank's at 10^5 actions a rank).

        The curve starts at (0, 0). A forward adds (its start, the level after it, floored at
        0). Another pass first adds (its start, the highest while it runs) where that is above
        the level before it (a recomputed backward rebuilds its activations first), then (its
        end, the level after it, floored at 0) unless it is an ``I`` that leaves the level as
        it was. The level before each pass is the one after the pass before it, floored at 0."""
        if in_bytes and self.memory is None:
            raise ValueError("no sizes were given: the memory curve exists in M_B units only")
        sizes = (self.memory.effective() if in_bytes
                 else unit_sizes(_stages_on_rank(self.schedule)[rank], schedule_recompute(self.schedule)))
        spans = self.timeline[rank]
        n = len(spans)
        kind, high, after = levels(list(map(itemgetter(0), spans)), sizes)
        floored = np.where(0.0 > after, 0.0, after)  # Python's max(after, 0.0), signed zeros included
        before = np.concatenate(([0.0], floored))[:-1]
        forward = kind == KINDS.index(Op.F)
        rises = ~forward & (high > before)
        last = np.where(rises, high, before)
        settles = forward | (kind != KINDS.index(Op.I)) | (after != last)
        starts = np.fromiter(map(itemgetter(1), spans), float, n)
        ends = np.fromiter(map(itemgetter(2), spans), float, n)
        # up to two steps per pass, in order: the rise, then where it settles
        times = np.stack((starts, np.where(forward, starts, ends)), axis=1).ravel()
        held = np.stack((high, floored), axis=1).ravel()
        kept = np.stack((rises, settles), axis=1).ravel()
        return np.concatenate(([0.0], times[kept])), np.concatenate(([0.0], held[kept]))

    def metrics(self) -> dict:
        """The metrics as plain numbers (what ``simulate --json`` prints); ``recompute``: the
        model's stages whose recomputation the times include (as ``--recompute`` names them:
        DualPipe's in both copies)."""
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
            **({"peak_memory_bytes": list(self.peak_memory_bytes)} if self.peak_memory_bytes is not None else {}),
            "parameter_copies": self.parameter_copies,
            "recompute": sorted({self.schedule.model_stage(s) for s in self._recomputed()}),
        }

    def _recomputed(self) -> frozenset:
        """The stages timed (and, in bytes, counted) as recomputing."""
        if self.memory is not None:
            return self.memory.recompute
        own = schedule_recompute(self.schedule)
        return own.stages if own is not None else frozenset()


_new_tuple = tuple.__new__
UNIT_PEAKS = "unit_peaks"  # Schedule.derived keys (UNIT_PEAKS, recompute): unit_peaks' answer
RUNS = "runs"  # Schedule.derived keys (RUNS, costs, recompute): (durations, starts, ends) of that run


def _stages_on_rank(schedule: Schedule) -> list[float]:
    """Per rank, how many of its stages make one M_B share: its stage count, over the model
    copies (DualPipe's two stages on a rank are two whole shares of one copy: 2/2)."""
    return [max(1, len(s)) / schedule.pipelines for s in stages_by_rank(schedule.placement, schedule.ranks)]


def unit_peaks(schedule: Schedule) -> list[float]:
    """Each rank's peak activations in M_B (with the recomputation the schedule carries): order
    only, so no run is needed (what :func:`pipesched.registry.peak_memory` asks), and computed
    once per schedule object (:func:`~pipesched.memory.unit_peak` of each rank's actions)."""
    own = schedule_recompute(schedule)
    peaks = schedule.derived.get((UNIT_PEAKS, own))
    if peaks is None:
        program = lowered(schedule)
        peaks = schedule.derived[(UNIT_PEAKS, own)] = unit_rank_peaks(
            program.stage, program.kind, program.rank_ids, _stages_on_rank(schedule), own)
    return list(peaks)


def action_durations(schedule: Schedule, costs: Costs) -> dict[tuple[int, Op], float]:
    """Duration of each (stage, kind) under ``costs`` for this schedule's placement."""
    return durations_for(schedule.placement, schedule.ranks, costs, schedule.pipelines)


def durations_by_id(schedule: Schedule, program: Program, costs: Costs, recompute: frozenset = frozenset()) -> list[float]:
    """Duration of every action of the lowered program, in id order (an overlapped pair's on
    its forward's id, priced by ``costs.overlap``); a recomputed stage's ``I`` and ``B`` re-run
    its forward first."""
    return program_durations(program, costs, recompute)


@collector_paused()
def simulate(schedule: Schedule, costs: Optional[Costs] = None, memory: Optional[MemorySizes] = None,
             gathers: Optional[Sequence[Sequence[tuple[int, float]]]] = None) -> SimResult:
    """Simulate ``schedule`` under ``costs`` (unit costs, no latency, by default).

    ``gathers``: FSDP's all-gathers on each rank's communication lane, per action id of the
    schedule's lowered program (:func:`pipesched.execution.run`).

    ``memory``: per-stage sizes in bytes (and which stages recompute): adds peak bytes per rank,
    and a recomputed stage's ``I``/``B`` takes its ``F`` longer. A schedule that carries its own
    recomputation (``meta["recompute"]``, zb-auto's choice) is timed with it when ``memory``
    does not say otherwise, and its M_B peaks count it (:class:`~pipesched.memory.Recompute`).
    Raises ScheduleError for a malformed schedule and DeadlockError for one that cannot finish.
    """
    if not isinstance(schedule, Schedule):
        raise ConfigError(f"simulate takes a pipesched.Schedule (build_schedule, Schedule.from_csv), got {schedule!r:.60}")
    costs = as_costs(costs)
    check_structure(schedule)  # once per schedule object
    program = lowered(schedule)
    own = schedule_recompute(schedule)
    recompute = memory.recompute if memory is not None else (own.stages if own else frozenset())
    key = (RUNS, costs, recompute)  # a search simulates one schedule under one costs twice or more
    cached = None if gathers is not None else (
        schedule.derived.get(UNIT_RUN) if costs == UNIT and not recompute else schedule.derived.get(key))
    if cached is not None:
        durations, starts, ends = cached
    else:
        durations = durations_by_id(schedule, program, costs, recompute)
        starts, ends = run(program, durations, costs.comm, gathers)
        schedule.derived[FINISHED] = True  # validate need not run it again (see validate)
        if gathers is None:
            schedule.derived[key] = (durations, starts, ends)
    busy, first, last = [], [], []
    for ids in program.rank_ids:
        busy.append(sum(durations[ids.start:ids.stop]))
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
        peak_memory=tuple(unit_peaks(schedule)),
        _program=program,
        _starts=starts,
        _ends=ends,
        peak_memory_bytes=None if memory is None else tuple(
            rank_peaks(program.stage, program.kind, program.rank_ids, memory.effective())),
        memory=memory,
    )
