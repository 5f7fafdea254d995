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

import math
import time
from dataclasses import dataclass, field
from typing import Optional

from ..actions import Action
from ..costs import Costs
from ..dependencies import dependency
from ..execution import TOLERANCE, latency
from ..memory import UNIT_CHANGE, whole_stage_microbatches
from ..ops import Op
from ..placement import stages_by_rank
from ..ranking import objective_value
from ..schedule import Schedule
from ..schedules.choose import work_bound
from ..simulate import action_durations, simulate
from .ancestors import ancestor_bits

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


@dataclass(frozen=True)
class _Graph:
    """The passes of a schedule and the order the execution rules impose on them."""

    nodes: list[tuple[int, Action]]  # (rank, action), the variable S_i is node i's start
    durations: tuple[float, ...]  # node i's duration
    edges: list[tuple[int, int, float]]  # (before, after, lag)
    ancestors: list[int]  # bitset of the nodes that must come before node i
    by_rank: dict[int, list[int]]  # node ids per rank, in program order

    def ordered(self, a: int, b: int) -> bool:
        """True when the graph already orders ``a`` before ``b``."""
        return bool((self.ancestors[b] >> a) & 1)


@dataclass
class _Rows:
    """The constraint matrix, one row at a time (lower <= sum(value * x[column]) <= upper)."""

    rows: list[int] = field(default_factory=list)
    cols: list[int] = field(default_factory=list)
    vals: list[float] = field(default_factory=list)
    lo: list[float] = field(default_factory=list)
    hi: list[float] = field(default_factory=list)

    def add(self, terms, lower: float, upper: float) -> None:
        r = len(self.lo)
        for column, value in terms:
            self.rows.append(r)
            self.cols.append(column)
            self.vals.append(value)
        self.lo.append(lower)
        self.hi.append(upper)


def refine(
    schedule: Schedule,
    costs: Costs,
    memory_limit: float,
    objective: str,
    time_limit: float,
) -> Refinement:
    """Search for a schedule better than ``schedule`` (a split-backward one) within ``time_limit`` s.

    The steps: the dependency graph (:func:`_graph`), the pairs it leaves open
    (:func:`_open_pairs`), the constraints (:func:`_constraints`), HiGHS (:func:`_solve`), and
    the solution read back as per-rank orders (:func:`_decode`), kept only if it simulates better.
    """
    t0 = time.perf_counter()
    greedy = objective_value(simulate(schedule, costs), objective)
    bound = work_bound(schedule, costs, objective)

    def done(status, sched=None, best=greedy, lower=bound) -> Refinement:
        return Refinement(sched, status, greedy, best, min(max(lower, bound), best), time.perf_counter() - t0)

    if greedy <= bound * (1 + TOLERANCE):
        return done("greedy-optimal")
    if any(a.kind is Op.B for _, a in schedule.actions()):
        return done("skipped: the best candidate uses fused backwards")
    graph = _graph(schedule, costs)
    pairs = _open_pairs(graph)
    rows, variables, obj_var = _constraints(schedule, graph, pairs, memory_limit, objective, big=greedy)
    cutoff = greedy * (1 - MARGIN)
    remaining = max(0.05, 0.8 * time_limit - (time.perf_counter() - t0))  # room to read the result
    res = _solve(rows, variables, obj_var, len(graph.nodes), big=greedy, cutoff=cutoff, seconds=remaining)
    dual = getattr(res, "mip_dual_bound", None)
    dual = bound if dual is None or not math.isfinite(dual) else max(bound, float(dual))
    if res.status == 2:  # infeasible: nothing beats the greedy by the margin
        return done("greedy-optimal", lower=cutoff)
    if res.x is None:
        return done("time-limit", lower=min(dual, cutoff))
    refined = _decode(schedule, graph, res.x)
    result = simulate(refined, costs)
    value = objective_value(result, objective)
    if value >= greedy - TOLERANCE or result.max_peak_memory > memory_limit + TOLERANCE:
        return done("time-limit" if res.status != 0 else "greedy-optimal", lower=min(dual, cutoff))
    if res.status != 0:
        # a better schedule found before the time ran out is not taken: what the solver reaches
        # in time depends on the machine, and every rank must derive the same plan
        return done("time-limit", lower=min(dual, value))
    return done("optimal", refined, best=value, lower=value)


def _graph(schedule: Schedule, costs: Costs) -> _Graph:
    """Every pass, its duration, and the edges: each pass's dependency (with its cross-rank
    latency) and, per stage and kind, microbatch order (the restriction every schedule here keeps)."""
    nodes = [(r, a) for r, a in schedule.actions()]
    index = {a: i for i, (_, a) in enumerate(nodes)}
    dur_of = action_durations(schedule, costs)
    durations = tuple(dur_of[(a.stage, a.kind)] for _, a in nodes)
    preds: list[list[int]] = [[] for _ in nodes]
    edges = []
    for i, (r, a) in enumerate(nodes):
        dep = dependency(a, schedule.stages)
        if dep is not None:
            s, output, k = dep
            j = index[Action(s, output.makers[0], k)]  # an input gradient is an I's: no fused B here
            edges.append((j, i, latency(schedule.placement, s, a.stage, costs.comm)))
            preds[i].append(j)
        if a.microbatch > 0:
            j = index[Action(a.stage, a.kind, a.microbatch - 1)]
            edges.append((j, i, 0.0))
            preds[i].append(j)
    by_rank: dict[int, list[int]] = {}
    for i, (r, _) in enumerate(nodes):
        by_rank.setdefault(r, []).append(i)
    ancestors = ancestor_bits(preds)
    return _Graph(nodes, durations, edges, ancestors, by_rank)


def _open_pairs(graph: _Graph) -> dict[tuple[int, int], int]:
    """Pairs of passes on one rank that the graph leaves unordered, each with its binary
    variable's column (after the ``n`` start times): ``y = 1`` runs the first one first."""
    n = len(graph.nodes)
    pairs: dict[tuple[int, int], int] = {}
    for members in graph.by_rank.values():
        for x in range(len(members)):
            a = members[x]
            for b in members[x + 1:]:
                if not graph.ordered(a, b) and not graph.ordered(b, a):
                    pairs[(a, b)] = n + len(pairs)
    return pairs


def _constraints(
    schedule: Schedule, graph: _Graph, pairs: dict[tuple[int, int], int],
    memory_limit: float, objective: str, big: float,
) -> tuple[_Rows, int, int]:
    """The MILP's rows, its number of variables and the objective's column."""
    n, d, nodes = len(graph.nodes), graph.durations, graph.nodes
    ranks = schedule.ranks
    variables = n + len(pairs) + 1 + (ranks if objective == "span" else 0)
    obj_var = n + len(pairs)
    rows = _Rows()
    for j, i, lag in graph.edges:
        rows.add([(i, 1.0), (j, -1.0)], d[j] + lag, math.inf)
    for (a, b), y in pairs.items():
        rows.add([(b, 1.0), (a, -1.0), (y, -big)], d[a] - big, math.inf)  # y=1: a before b
        rows.add([(a, 1.0), (b, -1.0), (y, big)], d[b], math.inf)  # y=0: b before a
    _memory_rows(rows, schedule, graph, pairs, memory_limit)
    if objective == "makespan":
        for i, (_, a) in enumerate(nodes):
            if a.kind is Op.W:
                rows.add([(obj_var, 1.0), (i, -1.0)], d[i], math.inf)
    else:
        first = {r: obj_var + 1 + r for r in range(ranks)}
        for i, (r, a) in enumerate(nodes):
            if a.kind is Op.F and a.microbatch == 0:
                rows.add([(first[r], 1.0), (i, -1.0)], -math.inf, 0.0)
            if a.kind is Op.W:
                rows.add([(obj_var, 1.0), (i, -1.0), (first[r], 1.0)], d[i], math.inf)
    return rows, variables, obj_var


def _memory_rows(rows: _Rows, schedule: Schedule, graph: _Graph, pairs: dict, memory_limit: float) -> None:
    """When a forward starts, the forwards already started minus the weight passes already done
    on its rank stay within the limit (in the rank's stage-microbatches)."""
    nodes = graph.nodes
    held = {r: len(h) for r, h in enumerate(stages_by_rank(schedule.placement, schedule.ranks))}
    for r, members in graph.by_rank.items():
        cap = whole_stage_microbatches(memory_limit, held[r])
        for f in members:
            if nodes[f][1].kind is not Op.F:
                continue
            terms: dict[int, float] = {}
            const = 1.0
            for g in members:
                if g == f:
                    continue
                sign = UNIT_CHANGE[nodes[g][1].kind]  # F takes one M_B, W frees it
                if not sign:
                    continue  # I holds on (nodes hold no fused B: refine skips those schedules)
                if graph.ordered(g, f):
                    const += sign
                elif graph.ordered(f, g):
                    continue
                elif (g, f) in pairs:
                    terms[pairs[(g, f)]] = terms.get(pairs[(g, f)], 0.0) + sign
                else:
                    y = pairs[(f, g)]
                    const += sign
                    terms[y] = terms.get(y, 0.0) - sign
            rows.add(list(terms.items()), -math.inf, cap - const)


def _solve(rows: _Rows, variables: int, obj_var: int, n: int, big: float, cutoff: float, seconds: float):
    """HiGHS on the model: minimise the objective variable, capped at ``cutoff``."""
    # numpy and scipy load on the first refinement: every command line imports this module
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    c = np.zeros(variables)
    c[obj_var] = 1.0
    integrality = np.zeros(variables)
    integrality[n:obj_var] = 1
    lower = np.zeros(variables)
    upper = np.full(variables, big)
    upper[n:obj_var] = 1.0
    upper[obj_var] = cutoff
    matrix = coo_matrix((rows.vals, (rows.rows, rows.cols)), shape=(len(rows.lo), variables)).tocsr()
    return milp(c, integrality=integrality, bounds=Bounds(lower, upper),
                constraints=LinearConstraint(matrix, rows.lo, rows.hi),
                options={"time_limit": seconds, "node_limit": NODE_LIMIT, "disp": False,
                         "mip_rel_gap": MARGIN / 2})


def _decode(schedule: Schedule, graph: _Graph, solution) -> Schedule:
    """Each rank's passes sorted by their start times in the solution."""
    starts = solution[:len(graph.nodes)]
    orders = [sorted(members, key=lambda i: (starts[i], i)) for _, members in sorted(graph.by_rank.items())]
    return Schedule(
        schedule.ranks, schedule.microbatches, schedule.placement,
        tuple(tuple(graph.nodes[i][1] for i in o) for o in orders), name=schedule.name,
    )
