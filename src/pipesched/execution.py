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
to integer ids with each action's dependency resolved once, from the rule's tables
(:class:`~pipesched.dependencies.Dependencies`); runs then only index lists.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from typing import NamedTuple, Optional, Sequence

import numpy as np

from .actions import Action, Overlap, Slot, sub_actions
from .dependencies import dependencies, dependency
from .errors import DeadlockError
from .ops import Op

NO_DEPENDENCY = -1
MISSING = -2
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


@dataclass(frozen=True)
class Program:
    """Per-rank programs lowered to integer ids, each with its dependency's id."""

    actions: list[Action]  # by id
    rank_ids: list[range]  # per rank, its ids in program order (consecutive)
    dep: list[int]  # id of the dependency, NO_DEPENDENCY or MISSING
    cross: list[bool]  # True when the dependency lives on another rank
    rank_of: list[int]  # rank of each id
    placement: tuple[int, ...]
    index: dict  # action -> id (a duplicated action keeps its last id)
    partner: list[int]  # for an overlapped pair's forward: its backward's id (which follows); else -1
    pipelines: int  # model copies the stages form (see dependency)


def lower(orders: Sequence[Sequence[Slot]], placement: Sequence[int], pipelines: int = 1) -> Program:
    """Number the actions (an overlapped pair's two halves in a row) and resolve every
    dependency to an id: the first of its makers' kinds that the programs hold (``pipelines``
    as in :func:`~pipesched.dependencies.dependency`)."""
    actions: list[Action] = []
    rank_ids: list[range] = []
    rank_of: list[int] = []
    partner: list[int] = []
    for r, order in enumerate(orders):
        first = len(actions)
        if Overlap in set(map(type, order)):
            for entry in order:
                parts = sub_actions(entry)
                partner.extend([len(actions) + 1, -1] if len(parts) == 2 else [-1])
                actions.extend(parts)
        else:  # no pairs: the entries are the actions (the common case, without a call per action)
            actions.extend(order)
            partner.extend([-1] * len(order))
        rank_of.extend([r] * (len(actions) - first))
        rank_ids.append(range(first, len(actions)))
    index = dict(zip(actions, range(len(actions))))  # a duplicated action keeps its last id
    dep, cross = _resolve(actions, index, rank_of, len(placement), pipelines)
    return Program(actions, rank_ids, dep, cross, rank_of, tuple(placement), index, partner, pipelines)


_KINDS = (Op.F, Op.I, Op.W, Op.B)  # the compute kinds, numbered for the arrays of _resolve


def _looked_up(action: Action, index: dict, inputs: dict) -> int:
    """One action's dependency id found in ``index`` (action -> id), the slow way."""
    need = inputs[action[1]][action[0]]
    found = () if need is None else (index.get((need[0], maker, action[2])) for maker in need[1])
    return NO_DEPENDENCY if need is None else next((d for d in found if d is not None), MISSING)


def _resolve(actions: Sequence[Action], index: dict, rank_of: Sequence[int], stages: int,
             pipelines: int) -> tuple[list[int], list[bool]]:
    """Each action's dependency id (the first of its makers' kinds the programs hold, as
    :class:`~pipesched.dependencies.Dependencies` tabulates the rule; NO_DEPENDENCY, or MISSING
    for an input no action makes and an action on no stage) and whether it crosses ranks.
    Array lookups in an id table of (stage, kind, microbatch): a dictionary lookup per action
    cost most of a lowering at p = 64, m = 512."""
    n = len(actions)
    if not n:
        return [], []
    code = {kind: c for c, kind in enumerate(_KINDS)}
    stage = np.fromiter(map(itemgetter(0), actions), np.int64, n)
    kind = np.fromiter(map(code.get, map(itemgetter(1), actions), repeat(len(_KINDS))), np.int64, n)
    micro = np.fromiter(map(itemgetter(2), actions), np.int64, n)
    # a dense table of ids holds the actions numbered within what n actions can hold (each of a
    # pipeline's microbatches has a forward and a backward on every stage): at most ~5n ids; an
    # action on no stage waits for MISSING (validation names it), one numbered past is looked up
    known = (stage >= 0) & (stage < stages) & (kind < len(_KINDS)) & (micro >= 0) & (micro * stages < n * pipelines)
    row, col, at = np.where(known, stage, stages), np.where(known, kind, len(_KINDS)), np.where(known, micro, 0)
    ids = np.full((stages + 1, len(_KINDS) + 1, int(at.max()) + 1), MISSING, np.int64)
    ids[row, col, at] = np.arange(n)
    ids[stages] = MISSING  # where the others were parked: no one's producer
    # per (stage, kind): producer stage and up to two maker kinds (stage ``stages``: no producer)
    producer = np.full((stages + 1, len(_KINDS) + 1), stages, np.int64)
    makers = np.full((stages + 1, len(_KINDS) + 1, 2), len(_KINDS), np.int64)
    free = np.zeros((stages + 1, len(_KINDS) + 1), bool)
    inputs = dependencies(stages, pipelines).inputs
    for c, k in enumerate(_KINDS):
        for s, need in enumerate(inputs[k]):
            if need is None:
                free[s, c] = True
                continue
            producer[s, c] = need[0]
            makers[s, c, :len(need[1])] = [code[m] for m in need[1]]
    dep, second = (ids[producer[row, col], makers[row, col, j], at] for j in (0, 1))
    dep = np.where(dep >= 0, dep, second)
    dep = np.where(free[row, col], NO_DEPENDENCY, np.where(dep >= 0, dep, MISSING))
    for i in np.flatnonzero(~known & (stage >= 0) & (stage < stages) & (kind < len(_KINDS))).tolist():
        dep[i] = _looked_up(actions[i], index, inputs)  # numbered past the table: its maker too
    ranks = np.asarray(rank_of, np.int64)
    cross = (dep >= 0) & (ranks[np.maximum(dep, 0)] != ranks)
    return dep.tolist(), cross.tolist()


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
