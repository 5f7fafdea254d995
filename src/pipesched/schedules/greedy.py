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
from functools import lru_cache
from typing import Optional

from ..actions import Action
from ..costs import Costs, durations_for
from ..dependencies import Output, dependencies
from ..execution import TOLERANCE, latency
from ..memory import UNIT_CHANGE, whole_stage_microbatches
from ..ops import COMPUTE, Op
from ..placement import stages_by_rank
from ..schedule import Schedule


@dataclass(frozen=True)
class Knobs:
    """Switches of the greedy construction (cf. the Zero Bubble heuristic's three knobs)."""

    backward_first: bool = True  # a ready I goes before a ready F (False: F first)
    wait_for_backward: bool = False  # skip an F that would delay a backward arriving meanwhile
    fill_partial_gaps: bool = False  # run a W in a wait even when it overruns the arrival
    later_stage_first: bool = True  # among ready actions of one kind, the later stage first
    reserve: int = 1  # room kept for later stages' forwards on a rank holding several stages

def greedy_orders(
    placement: tuple[int, ...],
    ranks: int,
    microbatches: int,
    costs: Costs,
    memory_limit: float,
    knobs: Knobs = Knobs(),
) -> Optional[tuple[tuple[Action, ...], ...]]:
    """Per-rank programs built greedily under ``costs``; None if the limit admits no progress."""
    caps = tuple(whole_stage_microbatches(memory_limit, len(h)) for h in stages_by_rank(placement, ranks))
    return memoized(placement, ranks, microbatches, costs, caps, knobs)


@lru_cache(maxsize=8)
def memoized(placement: tuple[int, ...], ranks: int, microbatches: int, costs: Costs, caps: tuple[int, ...],
                   knobs: Knobs) -> Optional[tuple[tuple[Action, ...], ...]]:
    """The construction at each rank's cap in whole stage-microbatches: the limit enters only
    through them. A pure function, kept for the last few: within one search the V families
    (zb-v and v-half often hold one cap under a device's memory) and zb-auto's V seeds ask
    for the same constructions."""
    orders = _GreedyRun(placement, ranks, microbatches, costs, caps, knobs).orders()
    return None if orders is None else tuple(tuple(o) for o in orders)


class _GreedyRun:
    """One construction: per-rank clocks and memory, what each stage has done, a wake-up queue.

    Ranks are visited in time order; a rank whose next input is not known yet sleeps until an
    action it depends on is placed. A W placed while a rank slept starts at the rank's clock
    (the rank was idle then), so waits can be filled after the fact.

    Every decision reads per-stage tables made once here (where each kind's input comes from and
    its delay, the durations, the room a forward needs): the construction makes a few decisions
    per action, hundreds of thousands at p = 64, m = 512.
    """

    def __init__(self, placement, ranks, microbatches, costs, caps, knobs) -> None:
        self.placement = placement
        self.m = microbatches
        stages = len(placement)
        self.knobs = knobs
        held_by = stages_by_rank(placement, ranks)
        dur = durations_for(placement, ranks, costs)
        self.f_dur = [dur[(s, Op.F)] for s in range(stages)]
        self.i_dur = [dur[(s, Op.I)] for s in range(stages)]
        self.w_dur = [dur[(s, Op.W)] for s in range(stages)]
        self.cap = caps
        self.f_end: list[list[Optional[float]]] = [[None] * microbatches for _ in range(stages)]
        self.g_end: list[list[Optional[float]]] = [[None] * microbatches for _ in range(stages)]
        self.next_f = [0] * stages
        self.next_i = [0] * stages
        rule = dependencies(stages)
        ends = {Output.ACTIVATION: self.f_end, Output.INPUT_GRAD: self.g_end}
        # per kind and stage: None (its input is there from the start), or (the end times of
        # what the stage it comes from made, by microbatch; the delay to this stage)
        source = {kind: [None if need is None else (ends[need[1]][need[0]], latency(placement, need[0], s, costs.comm))
                         for s, need in enumerate(rule.needs[kind])] for kind in (Op.F, Op.I)}
        f_source, i_source = source[Op.F], source[Op.I]
        # per kind and stage: None, or (the rank of the stage waiting for this pass, the delay)
        self.wakes = {kind: [None if c is None else (placement[c], latency(placement, s, c, costs.comm))
                             for s, c in enumerate(rule.consumers[kind])] for kind in COMPUTE}
        # a forward's room: its own activation, and on a rank's earlier stages the reserve
        room = [1 + (knobs.reserve if s != held_by[placement[s]][-1] else 0) for s in range(stages)]
        self.clock = [0.0] * ranks
        self.held = [0] * ranks
        self.pending: list[deque] = [deque() for _ in range(ranks)]
        self.out: list[list[Action]] = [[] for _ in range(ranks)]
        self.remaining = [3 * microbatches * len(h) for h in held_by]
        # per rank, its stages in the order a step looks at them, each with its tables' rows
        self.scan = [[(s, i_source[s], f_source[s], room[s])
                      for s in sorted(h, reverse=knobs.later_stage_first)] for h in held_by]
        self.heap: list[tuple[float, int, int]] = []
        self.tick = itertools.count()

    def orders(self) -> Optional[list[list[Action]]]:
        for r in range(len(self.clock)):
            self.wake(r, 0.0)
        heap, remaining, clock, step = self.heap, self.remaining, self.clock, self.step
        while heap:
            now, _, r = heapq.heappop(heap)
            if remaining[r] == 0 or now < clock[r] - TOLERANCE:
                continue
            step(r, max(now, clock[r]))
        return None if any(remaining) else self.out

    def wake(self, r: int, at: float) -> None:
        heapq.heappush(self.heap, (max(at, self.clock[r]), next(self.tick), r))

    def place(self, r: int, action: Action, start: float) -> None:
        s, kind, k = action
        if kind is Op.F:
            end = start + self.f_dur[s]
            self.next_f[s] += 1
            self.f_end[s][k] = end
        elif kind is Op.I:
            end = start + self.i_dur[s]
            self.next_i[s] += 1
            self.g_end[s][k] = end
            self.pending[r].append(Action(s, Op.W, k))
        else:
            end = start + self.w_dur[s]
        self.clock[r] = end
        self.out[r].append(action)
        self.remaining[r] -= 1
        self.held[r] += UNIT_CHANGE[kind]
        woken = self.wakes[kind][s]
        heap, tick = self.heap, self.tick
        if woken is not None:
            woken_rank = woken[0]
            at = end + woken[1]
            heapq.heappush(heap, (max(at, self.clock[woken_rank]), next(tick), woken_rank))
        heapq.heappush(heap, (end, next(tick), r))  # wake(r, end): the clock is end

    def step(self, r: int, now: float) -> None:
        """Place one action on rank ``r`` (or schedule its next wake-up).

        One pass over the rank's stages finds what the rules ask (in the scan order): the first
        ready I and F, the known arrivals of backwards (for ``wait_for_backward``), the soonest
        known arrival, and whether a blocked forward is ready."""
        knobs, pending, clock = self.knobs, self.pending[r], self.clock[r]
        next_f, next_i, m = self.next_f, self.next_i, self.m
        free = self.cap[r] - self.held[r]
        horizon = now + TOLERANCE
        backs = []  # (arrival, stage) of the backwards whose arrival is known
        ready_b = ready_f = soonest = soonest_blocked = None
        open_work = blocked_ready = False
        for s, i_source, f_source, room in self.scan[r]:
            done = next_i[s]
            if done < m and done < next_f[s]:
                open_work = True
                a = 0.0 if i_source is None else i_source[0][done]
                if a is not None:
                    if i_source is not None:
                        a += i_source[1]
                    backs.append((a, s))
                    if ready_b is None and a <= horizon:
                        ready_b = (a, s)
                    if soonest is None or a < soonest:
                        soonest = a
            done = next_f[s]
            if done < m:
                open_work = True
                a = 0.0 if f_source is None else f_source[0][done]
                if a is not None and f_source is not None:
                    a += f_source[1]
                if room <= free:
                    if a is not None:
                        if ready_f is None and a <= horizon:
                            ready_f = (a, s)
                        if soonest is None or a < soonest:
                            soonest = a
                elif a is not None:
                    blocked_ready = blocked_ready or a <= horizon
                    if soonest_blocked is None or a < soonest_blocked:
                        soonest_blocked = a
        forward, input_backward = Op.F, Op.I
        if knobs.backward_first:
            kind, chosen = (input_backward, ready_b) if ready_b is not None else (forward, ready_f)
        else:
            kind, chosen = (forward, ready_f) if ready_f is not None else (input_backward, ready_b)
        if chosen is not None and kind is forward and knobs.wait_for_backward:
            f_end = max(clock, chosen[0]) + self.f_dur[chosen[1]] - TOLERANCE
            soon = min(((a, s) for a, s in backs if now < a < f_end), default=None)
            if soon is not None:
                kind, chosen = input_backward, soon  # not ready yet: handled as a wait below
        if chosen is not None and chosen[0] <= horizon:
            a, s = chosen
            if pending and self.w_fits(pending[0], clock, a):
                self.place(r, pending.popleft(), clock)
            else:
                self.place(r, Action(s, kind, next_f[s] if kind is forward else next_i[s]), max(clock, a))
            return
        if pending and blocked_ready:
            self.place(r, pending.popleft(), clock)  # a forward waits for the memory this W frees
            return
        if chosen is not None:
            soonest = chosen[0]
        elif pending and soonest_blocked is not None and (soonest is None or soonest_blocked < soonest):
            soonest = soonest_blocked
        if pending and (soonest is None and not open_work
                        or soonest is not None and self.w_fits(pending[0], clock, soonest)):
            self.place(r, pending.popleft(), clock)
            return
        if soonest is not None:
            self.wake(r, soonest)

    def w_fits(self, w: Action, free_at: float, arrival: float) -> bool:
        """Whether a W run at ``free_at`` fills the wait for an input arriving at ``arrival``."""
        if free_at + self.w_dur[w[0]] <= arrival + TOLERANCE:
            return True
        return self.knobs.fill_partial_gaps and free_at < arrival - TOLERANCE


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
    return Schedule(ranks, microbatches, placement, orders, name=name)
