"""Cost-aware greedy construction of split-backward schedules, for any placement.

The Zero Bubble paper's automatic scheduler (and its V-shaped sibling) builds each rank's
program by simulating the pipeline under the real costs and deciding, whenever a rank is free,
what it runs next. This module does that for any stage-to-rank placement:

- an input-gradient backward ``I`` whose input has arrived goes first (it is on the critical
  path of every earlier stage), then a forward ``F`` whose input has arrived;
- a forward may start only while the rank's activations stay within the memory limit; on a
  rank holding several stages, a forward of an earlier stage also keeps room for one forward of
  a later stage, so microbatches already inside the rank can always move on (no deadlock);
- the weight passes ``W`` (nobody waits for them) are deferred: they fill the waits for inputs
  and run early only when a forward needs the memory they free; the rest drain at the end.

:class:`Knobs` are the heuristic's switches; callers run several settings and keep the best
simulated result. The orders come out of a run in which every action followed its input, so
they are free of deadlock; their exact times come from :func:`pipesched.simulate`.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass
from typing import Optional

from ..actions import Action
from ..costs import Costs
from ..placement import stages_by_rank
from ..schedule import Schedule

_EPS = 1e-9


@dataclass(frozen=True)
class Knobs:
    """Switches of the greedy construction (cf. the Zero Bubble heuristic's three knobs)."""

    backward_first: bool = True  # a ready I goes before a ready F (False: F first)
    wait_for_backward: bool = False  # skip an F that would delay a backward arriving meanwhile
    fill_partial_gaps: bool = False  # run a W in a wait even when it overruns the arrival
    later_stage_first: bool = True  # among ready actions of one kind, the later stage first
    reserve: int = 1  # room kept for later stages' forwards on a rank holding several stages


ALL_KNOBS = tuple(Knobs(*bits) for bits in itertools.product((True, False), repeat=4))


def greedy_orders(
    placement: tuple[int, ...],
    ranks: int,
    microbatches: int,
    costs: Costs,
    memory_limit: float,
    knobs: Knobs = Knobs(),
) -> Optional[list[list[Action]]]:
    """Per-rank programs built greedily under ``costs``; None if the limit admits no progress."""
    from ..simulate import durations_for

    m = microbatches
    stages = len(placement)
    held_by = stages_by_rank(placement, ranks)
    dur = durations_for(placement, ranks, costs)
    cap = [int(memory_limit * len(h) + _EPS) for h in held_by]
    f_end: list[list[Optional[float]]] = [[None] * m for _ in range(stages)]
    g_end: list[list[Optional[float]]] = [[None] * m for _ in range(stages)]
    next_f = [0] * stages
    next_i = [0] * stages
    clock = [0.0] * ranks
    held = [0] * ranks
    pending: list[deque] = [deque() for _ in range(ranks)]
    out: list[list[Action]] = [[] for _ in range(ranks)]
    remaining = [3 * m * len(h) for h in held_by]
    order_of_stage = {s: (sorted(h, reverse=knobs.later_stage_first)) for h in held_by for s in h}
    scan = [order_of_stage[h[0]] if h else [] for h in held_by]

    def hop(src: int, dst: int) -> float:
        return costs.comm if placement[src] != placement[dst] else 0.0

    def arrival(kind: str, s: int) -> Optional[float]:
        if kind == "F":
            k = next_f[s]
            if s == 0:
                return 0.0
            t = f_end[s - 1][k]
            return None if t is None else t + hop(s - 1, s)
        k = next_i[s]
        if s == stages - 1:
            return f_end[s][k]
        t = g_end[s + 1][k]
        return None if t is None else t + hop(s + 1, s)

    def room_for_forward(r: int, s: int) -> bool:
        reserve = knobs.reserve if s != held_by[r][-1] else 0
        return held[r] + 1 + reserve <= cap[r]

    heap: list[tuple[float, int, int]] = []
    tick = itertools.count()

    def wake(r: int, at: float) -> None:
        heapq.heappush(heap, (max(at, clock[r]), next(tick), r))

    def place(r: int, action: Action, start: float) -> None:
        s, kind, k = action
        end = start + dur[(s, kind)]
        clock[r] = end
        out[r].append(action)
        remaining[r] -= 1
        if kind == "F":
            held[r] += 1
            next_f[s] += 1
            f_end[s][k] = end
            if s + 1 < stages:
                wake(placement[s + 1], end + hop(s, s + 1))
        elif kind == "I":
            next_i[s] += 1
            g_end[s][k] = end
            pending[r].append(Action(s, "W", k))
            if s > 0:
                wake(placement[s - 1], end + hop(s, s - 1))
        else:
            held[r] -= 1
        wake(r, end)

    for r in range(ranks):
        wake(r, 0.0)
    while heap:
        now, _, r = heapq.heappop(heap)
        if remaining[r] == 0 or now < clock[r] - _EPS:
            continue
        now = max(now, clock[r])
        _step(r, now, knobs, scan[r], m, next_f, next_i, arrival, room_for_forward,
              pending[r], clock, dur, place, wake)
    if any(remaining):
        return None
    return out


def _step(r, now, knobs, stage_scan, m, next_f, next_i, arrival, room_for_forward,
          pending, clock, dur, place, wake) -> None:
    """Decide and place one action on rank ``r`` (or schedule a wake-up)."""
    backs, fwds, blocked = [], [], []
    for s in stage_scan:
        if next_i[s] < m and next_i[s] < next_f[s]:
            backs.append((arrival("I", s), s))
        if next_f[s] < m:
            a = arrival("F", s)
            (fwds if room_for_forward(r, s) else blocked).append((a, s))
    ready_b = [(a, s) for a, s in backs if a is not None and a <= now + _EPS]
    ready_f = [(a, s) for a, s in fwds if a is not None and a <= now + _EPS]
    first, second = (ready_b, ready_f) if knobs.backward_first else (ready_f, ready_b)
    choice = None
    if first:
        choice = ("I" if first is ready_b else "F", first[0])
    elif second:
        choice = ("I" if second is ready_b else "F", second[0])
    if choice is not None and choice[0] == "F" and knobs.wait_for_backward:
        start_f = max(clock[r], choice[1][0])
        soon = [(a, s) for a, s in backs if a is not None and now < a < start_f + dur[(choice[1][1], "F")] - _EPS]
        if soon:
            choice = ("I", min(soon))
    if choice is not None and choice[1][0] <= now + _EPS:
        kind, (a, s) = choice
        if pending and _w_fits(pending[0], clock[r], a, knobs, dur):
            place(r, pending.popleft(), clock[r])
        else:
            k = next_f[s] if kind == "F" else next_i[s]
            place(r, Action(s, kind, k), max(clock[r], a))
        return
    if pending and any(a is not None and a <= now + _EPS for a, _ in blocked):
        place(r, pending.popleft(), clock[r])  # a forward waits for the memory this W frees
        return
    known = [a for a, _ in backs + fwds if a is not None]
    if pending:
        known += [a for a, _ in blocked if a is not None]
    soonest = min(known) if known else None
    if choice is not None:
        soonest = choice[1][0]
    if pending and (soonest is None and not backs and not fwds and not blocked
                    or soonest is not None and _w_fits(pending[0], clock[r], soonest, knobs, dur)):
        place(r, pending.popleft(), clock[r])
        return
    if soonest is not None:
        wake(r, soonest)


def _w_fits(w: Action, free_at: float, arrival: float, knobs: Knobs, dur) -> bool:
    """Whether a W run at ``free_at`` fills the wait for an input arriving at ``arrival``."""
    if free_at + dur[(w.stage, "W")] <= arrival + _EPS:
        return True
    return knobs.fill_partial_gaps and free_at < arrival - _EPS


def build_greedy(
    placement: tuple[int, ...],
    ranks: int,
    microbatches: int,
    costs: Costs,
    memory_limit: float,
    knobs: Knobs,
    name: str,
) -> Optional[Schedule]:
    """The greedy programs as a Schedule, or None when this setting gets stuck."""
    orders = greedy_orders(placement, ranks, microbatches, costs, memory_limit, knobs)
    if orders is None:
        return None
    return Schedule(ranks, microbatches, placement, tuple(tuple(o) for o in orders), name=name)
