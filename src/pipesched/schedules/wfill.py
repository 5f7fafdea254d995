"""Place the weight-gradient passes (W) of a split-backward schedule where they cost nothing.

Input: each rank's forwards and input-gradient backwards in a fixed order. The ranks are
executed under the cost model; whenever a rank would wait for an input, it runs pending ``W``s
that fit entirely in the wait (oldest first), and before a forward that would exceed the memory
limit it runs ``W``s to free activations. Leftover ``W``s drain at the end. Because the program
comes out of an execution, it is free of deadlock whenever the input order is, and the fill
knows its own start and end times: the ones :func:`pipesched.simulate.simulate` computes for it
(same rules from :mod:`pipesched.execution`, same durations, same float operations), and its
memory peaks, so a builder choosing among fills need not simulate them (:class:`Built`). The
same execution places the Ws at fixed lags behind their Is (ZB-H1's placement) with its times.

For speed (interleaved-zb fills programs of 200,000 actions several times per build) the
skeleton is first tabulated once (:func:`prepare`): each action's duration, the integer key of
the input it waits for and of the output it makes, and the ``W`` each ``I`` leaves pending; the
fills under each limit and wait rule (:func:`fill`) then only index lists.
"""

from __future__ import annotations

import math
from collections import deque
from typing import NamedTuple, Optional, Sequence

from ..actions import Action
from ..costs import Costs, durations_for
from ..errors import DeadlockError
from ..dependencies import OUTPUT, Output, dependency
from ..execution import TOLERANCE, latency
from ..memory import UNIT_CHANGE
from ..ops import Op
from ..placement import stages_by_rank
from ..schedule import Schedule
from ..validate import FINISHED

_OUTPUTS = tuple(Output)  # an output's position numbers the keys of what was made


class Prepared(NamedTuple):
    """A skeleton tabulated under one placement and cost model (:func:`prepare`)."""

    steps: list[list[tuple]]  # per rank, in program order: each action's (action, duration,
    # key of the input it waits for, that input's latency, key of its output, M_B it adds,
    # whether it is a forward, the (W, duration) an I leaves pending or None)
    placement: tuple[int, ...]
    keys: int  # output keys, and one more: the made-at-0 input of a pipeline's first forward


class Built(NamedTuple):
    """A placement of the Ws with what its execution found under the fill's costs, so that
    choosing among them (:func:`~.interleaved.pick_fastest`) need not simulate: the makespan,
    the longest stretch from a rank's first start to its last end, and the fullest rank's peak
    activations in M_B (stage-microbatches held at once, each its rank's share of one M_B, as
    :func:`pipesched.memory.unit_peak` counts them: what simulation reports)."""

    schedule: Schedule
    makespan: float
    span: float
    peak: float


def fullest_peak(held_most: Sequence[int], placement: tuple[int, ...]) -> float:
    """The fullest rank's peak in M_B from each rank's most stage-microbatches held at once."""
    shares = [max(1, len(s)) for s in stages_by_rank(placement, len(held_most))]
    return max((h / float(k) for h, k in zip(held_most, shares)), default=0.0)


def prepare(skeleton: Sequence[Sequence[Action]], placement: tuple[int, ...], costs: Costs) -> Prepared:
    """Tabulate ``skeleton`` once for every :func:`fill` of it under ``costs``."""
    stages = len(placement)
    table = durations_for(placement, len(skeleton), costs)
    microbatches = 1 + max((a[2] for order in skeleton for a in order), default=0)
    keys = stages * len(_OUTPUTS) * microbatches
    outputs = {o: i for i, o in enumerate(_OUTPUTS)}

    def key(stage: int, output: Output) -> int:  # of microbatch 0; microbatch k's is k more
        return (stage * len(_OUTPUTS) + outputs[output]) * microbatches

    by_kind = {}  # (stage, kind) -> what does not vary with the microbatch
    for s in range(stages):
        for kind in (Op.F, Op.I, Op.W, Op.B):
            dep = dependency(Action(s, kind, 0), stages)
            by_kind[(s, kind)] = (  # no input: "made" at time 0 in key ``keys`` (waits for nothing)
                table[(s, kind)], keys if dep is None else key(dep[0], dep[1]),
                0 if dep is None else 1, 0.0 if dep is None else latency(placement, dep[0], s, costs.comm),
                key(s, OUTPUT[kind]), UNIT_CHANGE[kind], kind is Op.F, table[(s, Op.W)] if kind is Op.I else None,
            )
    weight = Op.W
    steps = []
    for order in skeleton:
        rank_steps = []
        append = rank_steps.append
        for action in order:
            s, kind, k = action
            duration, dep, per_k, lat, made, change, forward, w = by_kind[(s, kind)]
            append((action, duration, dep + per_k * k, lat, made + k, change, forward,
                    None if w is None else (Action(s, weight, k), w)))
        steps.append(rank_steps)
    return Prepared(steps, tuple(placement), keys)


def fill(prepared: Prepared, microbatches: int, memory_limit: float, name: str,
         fill_partial_waits: bool = False, lags: Optional[Sequence[int]] = None,
         give_up_after: float = math.inf) -> Optional[Built]:
    """Insert every ``W`` into the F/I programs of ``prepared``; the schedule and its times.

    With ``fill_partial_waits`` a pending ``W`` also starts in a wait shorter than itself (the
    next action starts a little late, but fewer ``W``s pile up at the end).

    With ``lags`` (one per rank) the ``W``s go in fixed places instead of the waits, and the
    limit is not consulted: rank ``r`` follows each ``I`` with the ``W`` of the ``I`` ``lags[r]``
    places earlier (ZB-H1's deferral; 0: its own), the rest at the end.

    None when an action would end after ``give_up_after`` (the makespan is then above it: zb-auto
    stops a re-placement that cannot win, :mod:`pipesched.auto.replaced`).
    """
    steps, placement = prepared.steps, prepared.placement
    ranks = len(steps)
    caps = [memory_limit * max(1, len(s)) + TOLERANCE for s in stages_by_rank(placement, ranks)]
    into_waits = lags is None
    lags = lags or [0] * ranks
    w_change = UNIT_CHANGE[Op.W]
    done = [-1.0] * prepared.keys + [0.0]  # when each output was made (-1: not yet)
    stuck: list = [None] * (prepared.keys + 1)  # per output key: the ranks waiting for it, or None
    pos = [0] * ranks
    clock = [0.0] * ranks
    held = [0] * ranks
    first = [0.0] * ranks  # each rank's first start
    most = [0] * ranks  # each rank's most held
    pending: list[deque] = [deque() for _ in range(ranks)]
    out: list[list[Action]] = [[] for _ in range(ranks)]
    runnable = deque(range(ranks))
    while runnable:
        r = runnable.popleft()
        program, p, c, h, queue, placed, cap = steps[r], pos[r], clock[r], held[r], pending[r], out[r], caps[r]
        m_r, lag, place = most[r], lags[r], out[r].append
        n = len(program)
        while p < n:
            action, duration, dep, lat, made, change, forward, weight = program[p]
            if forward and into_waits:
                while h + 1 > cap and queue:  # free activations before taking more
                    w, took = queue.popleft()
                    place(w)
                    c = c + took
                    h += w_change
            t_dep = done[dep]
            if t_dep < 0:
                if stuck[dep] is None:
                    stuck[dep] = [r]
                else:
                    stuck[dep].append(r)
                break
            arrival = t_dep + lat
            if into_waits and queue and c < arrival - TOLERANCE:  # the wait: Ws into it
                fits = arrival + TOLERANCE
                while queue and c < arrival - TOLERANCE:
                    w, took = queue[0]
                    if c + took > fits and not fill_partial_waits:
                        break
                    queue.popleft()
                    place(w)
                    c = c + took
                    h += w_change
            start = c if c >= arrival else arrival
            if not placed:
                first[r] = start
            c = start + duration
            if c > give_up_after:
                return None
            place(action)
            done[made] = c  # nothing waits for a W's output (dependencies.upstream): only these
            woken = stuck[made]
            if woken is not None:
                stuck[made] = None
                runnable.extend(woken)
            h += change
            if h > m_r:
                m_r = h
            if weight is not None:
                queue.append(weight)
                if not into_waits and len(queue) > lag:  # the W of the I lag places back
                    w, took = queue.popleft()
                    place(w)
                    c = c + took
                    h += w_change
            p += 1
        else:
            while queue:
                w, took = queue.popleft()
                place(w)
                c = c + took
                h += w_change
        pos[r], clock[r], held[r], most[r] = p, c, h, m_r
    if any(c > give_up_after for c in clock):  # a W drained at the end ended after it
        return None
    if any(pos[r] < len(steps[r]) for r in range(ranks)):
        raise DeadlockError(f"{name}: the forward/backward order deadlocks before W placement")
    used = [r for r in range(ranks) if out[r]]
    schedule = Schedule(ranks, microbatches, placement, tuple(tuple(o) for o in out), name=name)
    schedule.derived[FINISHED] = True  # an execution of these programs finished: free of deadlock
    return Built(schedule, max((clock[r] for r in used), default=0.0),
                 max((clock[r] - first[r] for r in used), default=0.0), fullest_peak(most, placement))


def fill_weight_passes(
    skeleton: Sequence[Sequence[Action]],
    placement: tuple[int, ...],
    microbatches: int,
    costs: Costs,
    memory_limit: float,
    name: str,
    fill_partial_waits: bool = False,
    give_up_after: float = math.inf,
) -> Optional[Schedule]:
    """Insert every ``W`` into the F/I programs in ``skeleton``; return the full schedule
    (:func:`fill` of one :func:`prepare`; None past ``give_up_after``)."""
    built = fill(prepare(skeleton, placement, costs), microbatches, memory_limit, name, fill_partial_waits,
                 give_up_after=give_up_after)
    return None if built is None else built.schedule
