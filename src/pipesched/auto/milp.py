"""Exact refinement of a greedy schedule by mixed-integer programming (HiGHS via scipy).

The model is the Zero Bubble paper's ILP, restricted the way every schedule here is: per stage,
forwards, input-gradient backwards and weight passes each run in microbatch order.

- variables: the start ``S`` of every F/I/W pass; a binary ``y_ab`` for every pair of passes on
  one rank whose order the dependency graph leaves open (1: ``a`` first);
- dependencies ``S_b >= S_a + d_a (+ comm)``, and ``S_b >= S_a + d_a - M(1 - y_ab)`` (and the
  converse) so that a rank runs one pass at a time;
- memory: when a forward starts, forwards already started minus weight passes already done stay
  within the limit;
- objective: makespan, or span (max over ranks of last end minus first start).

The greedy result bounds it: ``M`` is the greedy's objective, and the objective must beat the
greedy's by a small margin, so "infeasible" proves the greedy optimal. scipy's interface takes
no starting solution; the greedy's order enters as that cutoff only. The bound HiGHS proves
(together with a simple work-per-rank bound) gives the gap reported with the result.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..actions import Action
from ..costs import Costs
from ..execution import TOLERANCE, dependency, latency
from ..placement import stages_by_rank
from ..ranking import objective_value
from ..schedule import Schedule
from ..schedules.choose import work_bound

MARGIN = 1e-4  # relative improvement the solver must find to replace the greedy result
# Branch-and-bound nodes explored at most, besides the time limit. The time limit usually binds
# first (at the root), so what the MILP finds can depend on the machine's speed: the runtime
# therefore never lets ranks build a plan independently (torchrun ranks take rank 0's).
NODE_LIMIT = 400


@dataclass(frozen=True)
class Refinement:
    """What the exact refinement found: a better schedule (or None) and the proven bound."""

    schedule: Optional[Schedule]
    status: str  # "optimal", "greedy-optimal", "time-limit", "skipped: ..."
    greedy_value: float
    best_value: float
    lower_bound: float
    seconds: float

    @property
    def gap(self) -> float:
        """Relative gap between the best known value and the proven lower bound."""
        if self.best_value <= 0:
            return 0.0
        return max(0.0, (self.best_value - self.lower_bound) / self.best_value)


def _nodes(schedule: Schedule) -> list[tuple[int, Action]]:
    return [(r, a) for r, a in schedule.actions()]


def _closure(n: int, preds: list[list[int]], topo: list[int]) -> list[int]:
    """Ancestor bitsets (Python ints) in topological order."""
    anc = [0] * n
    for v in topo:
        bits = 0
        for u in preds[v]:
            bits |= anc[u] | (1 << u)
        anc[v] = bits
    return anc


def refine(
    schedule: Schedule,
    costs: Costs,
    memory_limit: float,
    objective: str,
    time_limit: float,
) -> Refinement:
    """Search for a schedule better than ``schedule`` (a split-backward one) within ``time_limit`` s."""
    from scipy.optimize import LinearConstraint, milp
    from scipy.sparse import coo_matrix

    from ..simulate import action_durations, simulate

    t0 = time.perf_counter()
    greedy = objective_value(simulate(schedule, costs), objective)
    bound = work_bound(schedule, costs, objective)

    def done(status, sched=None, best=greedy, lower=bound) -> Refinement:
        return Refinement(sched, status, greedy, best, min(max(lower, bound), best), time.perf_counter() - t0)

    if greedy <= bound * (1 + TOLERANCE):
        return done("greedy-optimal")
    nodes = _nodes(schedule)
    if any(a.kind == "B" for _, a in nodes):
        return done("skipped: the best candidate uses fused backwards")
    n = len(nodes)
    index = {a: i for i, (_, a) in enumerate(nodes)}
    dur_of = action_durations(schedule, costs)
    d = np.array([dur_of[(a.stage, a.kind)] for _, a in nodes])
    rank_of = [r for r, _ in nodes]
    stages = schedule.stages
    m = schedule.microbatches
    preds: list[list[int]] = [[] for _ in range(n)]
    edges = []  # (before, after, lag)
    for i, (r, a) in enumerate(nodes):
        dep = dependency(a, stages)
        if dep is not None:
            s, g, k = dep
            j = index[Action(s, "I" if g == "G" else g, k)]
            lag = latency(schedule.placement, s, a.stage, costs.comm)
            edges.append((j, i, lag))
            preds[i].append(j)
        if a.microbatch > 0:
            j = index[Action(a.stage, a.kind, a.microbatch - 1)]
            edges.append((j, i, 0.0))
            preds[i].append(j)
    topo = _topological(n, preds)
    anc = _closure(n, preds, topo)
    by_rank: dict[int, list[int]] = {}
    for i, r in enumerate(rank_of):
        by_rank.setdefault(r, []).append(i)
    pairs: dict[tuple[int, int], int] = {}
    for members in by_rank.values():
        for x in range(len(members)):
            a = members[x]
            for b in members[x + 1:]:
                if not (anc[b] >> a) & 1 and not (anc[a] >> b) & 1:
                    pairs[(a, b)] = n + len(pairs)
    ranks = schedule.ranks
    nv = n + len(pairs) + 1 + (ranks if objective == "span" else 0)
    obj_var = n + len(pairs)
    big = greedy
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def row(terms, lower, upper) -> None:
        r_ = len(lo)
        for c_, v_ in terms:
            rows.append(r_)
            cols.append(c_)
            vals.append(v_)
        lo.append(lower)
        hi.append(upper)

    for j, i, lag in edges:
        row([(i, 1.0), (j, -1.0)], d[j] + lag, np.inf)
    for (a, b), y in pairs.items():
        row([(b, 1.0), (a, -1.0), (y, -big)], d[a] - big, np.inf)  # y=1: a before b
        row([(a, 1.0), (b, -1.0), (y, big)], d[b], np.inf)  # y=0: b before a
    held = {r: len(h) for r, h in enumerate(stages_by_rank(schedule.placement, ranks))}
    for r, members in by_rank.items():
        cap = int(memory_limit * held[r] + TOLERANCE)
        for f in members:
            if nodes[f][1].kind != "F":
                continue
            terms: dict[int, float] = {}
            const = 1.0
            for g in members:
                if g == f:
                    continue
                kind = nodes[g][1].kind
                if kind not in "FW":
                    continue
                sign = 1.0 if kind == "F" else -1.0
                if (anc[f] >> g) & 1:
                    const += sign
                elif (anc[g] >> f) & 1:
                    continue
                elif (g, f) in pairs:
                    terms[pairs[(g, f)]] = terms.get(pairs[(g, f)], 0.0) + sign
                else:
                    y = pairs[(f, g)]
                    const += sign
                    terms[y] = terms.get(y, 0.0) - sign
            row(list(terms.items()), -np.inf, cap - const)
    if objective == "makespan":
        for i, (_, a) in enumerate(nodes):
            if a.kind == "W":
                row([(obj_var, 1.0), (i, -1.0)], d[i], np.inf)
    else:
        first = {r: obj_var + 1 + r for r in range(ranks)}
        for i, (r, a) in enumerate(nodes):
            if a.kind == "F" and a.microbatch == 0:
                row([(first[r], 1.0), (i, -1.0)], -np.inf, 0.0)
            if a.kind == "W":
                row([(obj_var, 1.0), (i, -1.0), (first[r], 1.0)], d[i], np.inf)
    cutoff = greedy * (1 - MARGIN)
    c = np.zeros(nv)
    c[obj_var] = 1.0
    integrality = np.zeros(nv)
    integrality[n:obj_var] = 1
    lower = np.zeros(nv)
    upper = np.full(nv, big)
    upper[n:obj_var] = 1.0
    upper[obj_var] = cutoff
    constraints = LinearConstraint(coo_matrix((vals, (rows, cols)), shape=(len(lo), nv)).tocsr(), lo, hi)
    remaining = max(0.05, 0.8 * time_limit - (time.perf_counter() - t0))  # room to read the result
    from scipy.optimize import Bounds

    res = milp(c, integrality=integrality, bounds=Bounds(lower, upper), constraints=constraints,
               options={"time_limit": remaining, "node_limit": NODE_LIMIT, "disp": False,
                        "mip_rel_gap": MARGIN / 2})
    dual = getattr(res, "mip_dual_bound", None)
    dual = bound if dual is None or not np.isfinite(dual) else max(bound, float(dual))
    if res.status == 2:  # infeasible: nothing beats the greedy by the margin
        return done("greedy-optimal", lower=cutoff)
    if res.x is None:
        return done("time-limit", lower=min(dual, cutoff))
    starts = res.x[:n]
    orders = [sorted(members, key=lambda i: (starts[i], i)) for r, members in sorted(by_rank.items())]
    refined = Schedule(
        schedule.ranks, m, schedule.placement,
        tuple(tuple(nodes[i][1] for i in o) for o in orders), name=schedule.name,
    )
    result = simulate(refined, costs)
    value = objective_value(result, objective)
    if value >= greedy - TOLERANCE or result.max_peak_memory > memory_limit + TOLERANCE:
        return done("time-limit" if res.status != 0 else "greedy-optimal", lower=min(dual, cutoff))
    if res.status != 0:
        # a better schedule found before the time ran out is not taken: what the solver reaches
        # in time depends on the machine, and every rank must derive the same plan
        return done("time-limit", lower=min(dual, value))
    return done("optimal", refined, best=value, lower=value)


def _topological(n: int, preds: list[list[int]]) -> list[int]:
    succs: list[list[int]] = [[] for _ in range(n)]
    indeg = [len(p) for p in preds]
    for v, ps in enumerate(preds):
        for u in ps:
            succs[u].append(v)
    ready = [v for v in range(n) if indeg[v] == 0]
    order = []
    while ready:
        v = ready.pop()
        order.append(v)
        for w in succs[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    return order
