"""The execution model every layer asks: what waits for what, what is sent, when it arrives.

An action starts when its rank has finished the previous action and its input has arrived
(which input: the dependency rule, :mod:`pipesched.dependencies`). An input produced on
another rank is a message (:func:`~pipesched.dependencies.consumer_stage` says who receives an
action's output) and arrives ``comm`` after it was produced (:func:`latency`); sends never
block. An overlapped pair (:class:`~pipesched.actions.Overlap`) starts when the rank is free and
both halves' inputs have arrived; both halves end together, after the pair's duration.
Computing start times is a longest path over this graph; when no rank can move, the schedule
deadlocks and the error names each stuck rank and what it waits for. Times and memory levels
are floats: compare them with :data:`TOLERANCE`.

The simulator, the validator, the schedule constructions (greedy, W placement), zb-auto's MILP
and the runtime's communication plan all take these rules from here. (What memory an action
takes and frees lives in the memory model.)

For speed (schedules reach hundreds of thousands of actions) the programs are first lowered
to integer ids with each action's dependency resolved once (:mod:`pipesched.lowering`); runs
then only index lists.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple, Optional, Sequence

from .actions import Action
from .dependencies import dependency
from .errors import DeadlockError
from .lowering import MISSING, Program, lower

TOLERANCE = 1e-9  # two times (or memory levels) this close are equal: sums of floats round


class Span(NamedTuple):
    """One executed action: what ran, and when."""

    action: Action
    start: float
    end: float


def crosses_ranks(placement: Sequence[int], producer: int, consumer: int) -> bool:
    """True when stage ``consumer``'s input from stage ``producer`` is a message between ranks."""
    return placement[producer] != placement[consumer]


def latency(placement: Sequence[int], producer: int, consumer: int, comm: float) -> float:
    """Delay between stage ``producer`` finishing and stage ``consumer`` having the result."""
    return comm if crosses_ranks(placement, producer, consumer) else 0.0


def run(program: Program, durations: Sequence[float], comm: float,
        gathers: Optional[Sequence[Sequence[tuple[int, float]]]] = None) -> tuple[list[float], list[float]]:
    """Start and end time of every action id; raises DeadlockError when ranks get stuck.

    An overlapped pair takes its forward's duration (see :func:`pair_durations`); its backward's
    is not used.

    ``gathers`` (FSDP's ``UNSHARD``s, by action id: the ``(stage, time)`` all-gathers its rank
    issues on reaching that action, before it): each rank has one communication lane beside its
    compute, running its gathers one at a time in issue order from the moment the rank reaches
    them (the end of its previous action); an action (both halves of a pair) also waits until
    the latest gather issued for its stage has landed.
    """
    if gathers is None and not program.paired:
        return _run_plain(program, durations, comm)
    n = len(program.actions)
    dep, cross, partner = program.dep, program.cross, program.partner
    starts = [0.0] * n
    ends = [-1.0] * n
    waiting: dict[int, list[int]] = {}
    ranks = len(program.rank_ids)
    pos = [0] * ranks
    free = [0.0] * ranks
    lane = [0.0] * ranks  # when each rank's communication lane is free
    issued = [0] * ranks  # how far each rank has issued its gathers
    landed: dict[int, float] = {}  # stage -> when its latest gather lands
    actions = program.actions
    runnable = deque(range(ranks))
    while runnable:
        r = runnable.popleft()
        ids = program.rank_ids[r]
        count = len(ids)
        i = pos[r]
        t = free[r]
        while i < count:
            a = ids[i]
            d = dep[a]
            start = t
            if d >= 0:
                t_dep = ends[d]
                if t_dep < 0:
                    waiting.setdefault(d, []).append(r)
                    break
                if cross[a]:
                    t_dep += comm
                if t_dep > start:
                    start = t_dep
            elif d == MISSING:
                break
            if gathers is not None:
                if issued[r] <= i:  # issued once, when the rank first reaches the action
                    for stage, took in gathers[a]:
                        lane[r] = max(lane[r], t) + took
                        landed[stage] = lane[r]
                    issued[r] = i + 1
                start = max(start, landed.get(actions[a][0], 0.0),
                            landed.get(actions[partner[a]][0], 0.0) if partner[a] >= 0 else 0.0)
            b = partner[a]
            if b >= 0:  # an overlapped pair also waits for its backward's input (the same check,
                # written out again: a call per action would slow every run by a fifth)
                d = dep[b]
                if d >= 0:
                    t_dep = ends[d]
                    if t_dep < 0:
                        waiting.setdefault(d, []).append(r)
                        break
                    if cross[b]:
                        t_dep += comm
                    if t_dep > start:
                        start = t_dep
                elif d == MISSING:
                    break
            t = start + durations[a]
            starts[a] = start
            ends[a] = t
            woken = waiting.pop(a, None)
            if woken:
                runnable.extend(woken)
            if b >= 0:
                starts[b] = start
                ends[b] = t
                woken = waiting.pop(b, None)
                if woken:
                    runnable.extend(woken)
                i += 1
            i += 1
        pos[r] = i
        free[r] = t
    stuck = [r for r in range(ranks) if pos[r] < len(program.rank_ids[r])]
    if stuck:
        raise DeadlockError(_deadlock_message(program, pos, stuck))
    return starts, ends


def _run_plain(program: Program, durations: Sequence[float], comm: float) -> tuple[list[float], list[float]]:
    """:func:`run` without pairs or gathers (the common case, the same rules and the same floats
    in a tighter loop): ids taken as they come (a rank's are consecutive), and each action's
    wait for its input read from ``ends`` alone. ``ends`` has two slots past the ids, where
    NO_DEPENDENCY (-1) and MISSING (-2) point: one finished at 0 (``max`` with a rank's time,
    at least 0, keeps that time) and one that never finishes (its rank stays stuck)."""
    n = len(program.actions)
    dep, cross = program.dep, program.cross
    starts = [0.0] * n
    ends = [-1.0] * n + [-1.0, 0.0]  # [n]: MISSING's (never ends), [n + 1]: NO_DEPENDENCY's (0)
    waiting: dict[int, list[int]] = {}
    pos = [ids.start for ids in program.rank_ids]
    free = [0.0] * len(pos)
    runnable = deque(range(len(pos)))
    while runnable:
        r = runnable.popleft()
        i, stop, t = pos[r], program.rank_ids[r].stop, free[r]
        while i < stop:
            d = dep[i]
            t_dep = ends[d]
            if t_dep < 0:
                waiting.setdefault(d, []).append(r)
                break
            if cross[i]:
                t_dep += comm
            if t_dep > t:
                t = t_dep
            starts[i] = t
            t += durations[i]
            ends[i] = t
            if i in waiting:
                runnable.extend(waiting.pop(i))
            i += 1
        pos[r], free[r] = i, t
    pos = [i - ids.start for i, ids in zip(pos, program.rank_ids)]
    stuck = [r for r, ids in enumerate(program.rank_ids) if pos[r] < len(ids)]
    if stuck:
        raise DeadlockError(_deadlock_message(program, pos, stuck))
    del ends[n:]
    return starts, ends


def pair_durations(program: Program, durations: Sequence[float], overlap: float) -> list[float]:
    """Durations with each overlapped pair's on its forward's id: ``max + overlap * min`` of
    the two halves (``overlap`` 1: one after the other; 0: fully hidden), 0 on its backward's."""
    paired = list(durations)
    for a, b in enumerate(program.partner):
        if b >= 0:
            da, db = durations[a], durations[b]
            paired[a] = max(da, db) + overlap * min(da, db)
            paired[b] = 0.0
    return paired


def execute(
    orders: Sequence[Sequence[Action]],
    placement: Sequence[int],
    duration,
    comm: float,
    pipelines: int = 1,
) -> list[list[Span]]:
    """Run the per-rank programs; ``duration`` maps an action to its time. Returns spans per rank
    (``pipelines`` as in :func:`dependency`)."""
    program = lower(orders, placement, pipelines)
    starts, ends = run(program, [duration(a) for a in program.actions], comm)
    return [[Span(program.actions[i], starts[i], ends[i]) for i in ids] for ids in program.rank_ids]


def _deadlock_message(program: Program, pos: list[int], stuck: list[int]) -> str:
    stages = len(program.placement)
    done = _finished_before(program, pos)
    parts = []
    for r in stuck:
        first = program.rank_ids[r][pos[r]]
        halves = (first, program.partner[first]) if program.partner[first] >= 0 else (first,)
        # the half whose input is missing (a pair's backward when its forward's input is there)
        action_id = next((x for x in halves if program.dep[x] == MISSING
                          or program.dep[x] >= 0 and program.dep[x] not in done),
                         first)
        action = program.actions[action_id]
        d = program.dep[action_id]
        if d == MISSING:
            s, output, k = dependency(action, stages, program.pipelines)
            wanted = f"{s}{output.label}{k}"
            parts.append(f"rank {r} waits at {action} for {wanted}, which no rank runs")
        else:
            owner = program.rank_of[d]
            parts.append(
                f"rank {r} waits at {action} for {program.actions[d]} (rank {owner})"
            )
    return "schedule deadlocks: " + "; ".join(parts)


def _finished_before(program: Program, pos: list[int]) -> set[int]:
    """Ids each rank ran before it got stuck."""
    return {x for r, ids in enumerate(program.rank_ids) for x in ids[:pos[r]]}
