"""The Zero Bubble authors' own automatic scheduler (their heuristic), reimplemented.

Source: sail-sg/zero-bubble-pipeline-parallelism,
``megatron/core/pipeline_parallel/zerobubble/scheduler/zb.py`` (``Graph.manual_order`` and
``initial_solution``; the paper's version is ``auto_schedule.py`` on the ``arxiv`` branch, the
one that computed the paper's ZB-1p and ZB-2p bubble rates). zb-auto keeps it among its
candidates (:mod:`pipesched.auto.search`), so that on any costs and limit zb-auto is never
behind what the authors' own construction gives; ``tests/golden/zb_paper_heuristic.json``
holds their code's results on the paper's measured costs, which this module reproduces.

One chunk per rank. Each stage places, microbatch by microbatch, its forwards and
input-gradient backwards at the earliest time their inputs allow, with a weight pass ``W``
put into a wait whenever one fits (or when memory needs the room it frees); three switches give
eight runs, and the run with the smallest span (over stages: the last ``W``'s end minus the
first ``F``'s start) wins, the earlier on ties, as in their ``initial_solution``. Memory is a
level per stage changed by each pass (``memory``: what ``F``, ``I`` and ``W`` add; zb-auto
passes its M_B model's 1, 0, -1) and kept at most ``limit``; a run that cannot keep it
gives no schedule.
"""

from __future__ import annotations

import itertools
from typing import Optional

from ..actions import Action
from ..costs import Costs, durations_for
from ..execution import TOLERANCE
from ..memory import UNIT_CHANGE
from ..ops import Op
from ..placement import loop_placement
from ..schedule import Schedule

F, B, W = 0, 1, 2  # the authors' pass numbering (B is pipesched's I)
KINDS = (Op.F, Op.I, Op.W)
M_B_CHANGE = tuple(UNIT_CHANGE[k] for k in KINDS)  # zb-auto's memory model: 1, 0, -1


class _Run:
    """One ``manual_order`` run: per-stage clocks (``end``), memory, idle time, placed counts."""

    def __init__(self, cost: list[tuple[float, float, float]], microbatches: int, memory: tuple[float, float, float],
                 limit: float, comm: float) -> None:
        self.cost, self.n, self.memory, self.limit, self.comm = cost, microbatches, memory, limit, comm
        stages = len(cost)
        self.stages = stages
        self.count = [[0, 0, 0] for _ in range(stages)]
        self.end = [0.0] * stages
        self.level = [0.0] * stages
        self.bubble = [0.0] * stages
        self.most_bubble = 0.0  # max(bubble): bubbles only grow, so a running maximum is exact
        self.times = [[[] for _ in range(stages)] for _ in KINDS]  # [kind][stage][microbatch]: end time
        self.order: list[list[tuple[int, int]]] = [[] for _ in range(stages)]

    def t(self, kind: int, stage: int, mb: int) -> float:
        row = self.times[kind][stage]
        return row[mb] if mb < len(row) else 0.0  # the authors' table starts at 0

    def over(self, stage: int, kind: int) -> bool:
        return self.level[stage] + self.memory[kind] > self.limit + TOLERANCE

    def put(self, j: int, kind: int) -> None:
        i = self.count[j][kind]
        cost = self.cost[j][kind]
        done = self.end[j] + cost
        no_bubble = done
        if j > 0 and kind == F:
            done = max(done, self.t(F, j - 1, i) + self.comm + cost)
        if j < self.stages - 1 and kind == B:
            done = max(done, self.t(B, j + 1, i) + self.comm + cost)
        if self.count[j][F] > 0:
            self.bubble[j] += done - no_bubble
            if self.bubble[j] > self.most_bubble:
                self.most_bubble = self.bubble[j]
        self.end[j] = done
        self.times[kind][j].append(done)  # the i-th of its kind on stage j
        self.level[j] += self.memory[kind]
        self.count[j][kind] += 1
        self.order[j].append((kind, i))

    def fill_wait(self, j: int, arrival: float, no_bubble_greedy: bool) -> None:
        """Weight passes into the wait for an input arriving at ``arrival`` (the authors' rule)."""
        c = self.count[j]
        while c[W] < c[B] and self.end[j] + self.cost[j][W] <= arrival:
            self.put(j, W)
        if c[W] < c[B] and self.end[j] < arrival:
            if arrival - self.end[j] <= self.most_bubble - self.bubble[j]:
                if no_bubble_greedy:
                    self.put(j, W)
            else:
                self.put(j, W)

    def make_room(self, j: int, kind: int) -> None:
        while self.over(j, kind):
            if self.count[j][W] >= self.count[j][B]:
                raise _NoFit
            self.put(j, W)

    def warm_up(self, allow_bubble_before_first_b: bool) -> None:
        for j in range(self.stages):
            self.put(j, F)
        extra = [0] * self.stages
        last = 0.0
        for j in range(self.stages - 1, -1, -1):
            if j == self.stages - 1:
                last = self.t(F, j, 0) + self.cost[j][B]
                continue
            level, clock = self.level[j], self.end[j]
            while self.count[j][F] + extra[j] < self.n and level + self.memory[F] <= self.limit + TOLERANCE:
                if allow_bubble_before_first_b:
                    if clock + self.cost[j][F] > last + self.comm:
                        break
                elif clock >= last + self.comm:
                    break
                level += self.memory[F]
                clock += self.cost[j][F]
                extra[j] += 1
            last = max(clock, last + self.comm) + self.cost[j][B]
        for j in range(1, self.stages):
            while extra[j] > 0 and extra[j] >= extra[j - 1] and self.count[j][F] + extra[j] < self.n:
                extra[j] -= 1
        for j in range(self.stages):
            for _ in range(extra[j]):
                self.put(j, F)
        for j in range(self.stages - 1, -1, -1):
            self.put(j, B)

    def wants_forward(self, j: int, prioritize_b: bool) -> bool:
        c, later = self.count[j], self.count[j + 1] if j + 1 < self.stages else None
        if c[F] >= self.n:
            return False
        if later is None or not prioritize_b or c[F] < later[F] + 2:
            return True
        round_trip = self.end[j + 1] + self.cost[j + 1][F] + self.cost[j + 1][B] + self.comm
        if self.end[j] >= round_trip:
            return False
        w_cost, w_count, level = 0.0, 0, self.level[j] + self.memory[F]
        while level > self.limit + TOLERANCE and c[W] + w_count < c[B]:
            w_cost += self.cost[j][W]
            level += self.memory[W]
            w_count += 1
        if self.end[j] + self.cost[j][F] + w_cost <= round_trip:
            return True
        return round_trip - self.end[j] > self.most_bubble - self.bubble[j]

    def steady(self, i: int, prioritize_b: bool, no_bubble_greedy: bool) -> None:
        wanted = [self.wants_forward(j, prioritize_b) for j in range(self.stages)]
        for j in range(self.stages - 2, -1, -1):
            wanted[j] = wanted[j] and wanted[j + 1]
        for j in range(self.stages):
            if not wanted[j]:
                continue
            self.make_room(j, F)
            if j > 0:
                self.fill_wait(j, self.t(F, j - 1, self.count[j][F]) + self.comm, no_bubble_greedy)
            self.put(j, F)
        for j in range(self.stages - 1, -1, -1):
            self.make_room(j, B)
            if j + 1 < self.stages:
                self.fill_wait(j, self.t(B, j + 1, i) + self.comm, no_bubble_greedy)
            if j == 0 and self.count[j][F] == self.n:
                while self.count[j][W] < self.count[j][B]:
                    self.put(j, W)
            self.put(j, B)

    def run(self, allow_bubble_before_first_b: bool, prioritize_b: bool, no_bubble_greedy: bool) -> float:
        """The authors' span of the whole construction."""
        self.warm_up(allow_bubble_before_first_b)
        for i in range(1, self.n):
            self.steady(i, prioritize_b, no_bubble_greedy)
        for j in range(self.stages):
            while self.count[j][W] < self.n:
                self.put(j, W)
        return max(self.t(W, j, self.n - 1) - self.t(F, j, 0) + self.cost[j][F] for j in range(self.stages))


class _NoFit(Exception):
    """A run whose memory limit leaves no pending W to free (the authors' "Cannot fit memory")."""


def heuristic_orders(cost: list[tuple[float, float, float]], microbatches: int, memory: tuple[float, float, float],
                     limit: float, comm: float) -> Optional[tuple[float, list[list[tuple[int, int]]]]]:
    """(span, per-stage (pass, microbatch) orders) of the best of the eight runs, as the
    authors' ``initial_solution`` picks it; None when no run keeps the limit.
    ``cost[s]``: stage ``s``'s F, B (input gradient) and W durations."""
    best = None
    for knobs in itertools.product((True, False), repeat=3):
        run = _Run(cost, microbatches, memory, limit, comm)
        try:
            span = run.run(*knobs)
        except _NoFit:
            continue
        if best is None or span < best[0]:
            best = (span, run.order)
    return best


def build_zb_heuristic(ranks: int, microbatches: int, costs: Costs, limit: float,
                       memory: tuple[float, float, float] = M_B_CHANGE) -> Optional[Schedule]:
    """The authors' heuristic as a pipesched schedule (one stage per rank), or None when no
    run keeps ``limit``."""
    placement = loop_placement(ranks)
    durations = durations_for(placement, ranks, costs)
    cost = [tuple(durations[(s, k)] for k in KINDS) for s in range(ranks)]
    found = heuristic_orders(cost, microbatches, memory, limit, costs.comm)
    if found is None:
        return None
    orders = tuple(tuple(Action(s, KINDS[k], mb) for k, mb in found[1][s]) for s in range(ranks))
    return Schedule(ranks, microbatches, placement, orders, name="zb-auto")
