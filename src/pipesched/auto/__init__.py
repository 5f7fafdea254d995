"""``zb-auto``: the automatic zero-bubble scheduler for measured costs and a memory limit.

:func:`build_auto` simulates every candidate of :mod:`.search` under the given costs, keeps the
best by the objective among those whose peak memory fits the limit, and, for small instances,
tries to improve it exactly with a mixed-integer program (:mod:`.milp`). The registry's
``zb-auto`` family calls it (with a 2 s refinement budget); ``build_schedule("zb-auto", ...,
objective="span")`` or this function choose the other.

The result's ``meta`` says which candidate won and what the exact refinement found
(``meta["milp"]``: status, proven lower bound, gap).

Given a limit and what a recomputed stage keeps (``recompute_input``), the search also offers
faster orders that fit by recomputing activations on the ranks over the limit (:mod:`.recompute`);
the winner's ``meta["recompute"]`` (a :class:`~pipesched.memory.Recompute`) names its stages,
the simulator times and counts them, and ``pipesched train`` applies them;
``meta["without_recompute"]`` is the objective of the best candidate that fits without
(None: none does).
"""

from __future__ import annotations

import itertools
from typing import Optional

from ..costs import UNIT, Costs
from ..errors import ConfigError
from ..memory import Recompute, schedule_recompute
from ..registry import BuildRequest
from ..execution import TOLERANCE
from ..schedule import Schedule
from ..ranking import check_objective, objective_value
from ..schedules.choose import ranked_schedules, work_bound
from ..schedules.limits import SMALLEST_LIMIT, resolve_limit
from .local import SWAP_EVALUATIONS, improve_by_swaps
from .milp import refine
from .recompute import leanest_recomputing_need, recomputing_candidates
from .replaced import FILL_PARTIAL_WAITS, REPLACEMENT_COST, note_origin, replaced_ranked
from .search import all_candidates, candidate_count

MILP_MAX_SIZE = 256  # ranks * microbatches up to which the exact refinement runs
TOP_FOR_W_REPLACEMENT = 3  # best candidates tried again with W re-placed for the costs


def build_auto(
    ranks: int,
    microbatches: int,
    costs: Optional[Costs] = None,
    memory_limit: Optional[float] = None,
    objective: str = "makespan",
    milp: bool = True,
    time_limit: float = 2.0,
    chunks: Optional[int] = None,
    recompute_input: Optional[float] = None,
) -> Schedule:
    """The best schedule found for these costs within ``memory_limit`` (activations per rank).

    ``objective``: ``"makespan"`` (ranks synchronise at the optimizer step) or ``"span"``
    (iterations overlap). ``milp``: when ``ranks * microbatches <= 256``, refine the best
    candidate within ``time_limit`` seconds, half by swapping neighbouring actions, half by the
    exact MILP; the candidate is kept unless they beat it. ``chunks`` (1 or 2) restricts the
    search to that many stages per rank; by default both are searched. ``recompute_input``: what
    a recomputed stage keeps (its input) as a share of its activations; given with a
    ``memory_limit``, recomputing on some ranks is searched too (then limits below 1 are
    accepted), and the winner recomputes only when that is faster than every leaner order.
    A recomputing winner is not refined (the swaps and the MILP count stored activations).
    """
    costs = costs or UNIT
    check_objective(objective)
    recomputing = recompute_input is not None and memory_limit is not None
    if recomputing:
        Recompute(frozenset(), recompute_input)  # a share outside [0, 1) fails here, in one line
        limit = resolve_limit(memory_limit, ranks, "zb-auto", recompute_input, "a recomputed stage's input")
    else:
        limit = resolve_limit(memory_limit, ranks, "zb-auto")
    costs.multipliers(ranks)  # a multiplier list that fits no stage count fails here, in one line
    origins: dict[int, str] = {}
    candidates = all_candidates(ranks, microbatches, costs, limit, chunks) if limit >= SMALLEST_LIMIT - TOLERANCE else iter(())
    if recomputing:  # after the pool: on ties, the order that stores its activations wins
        candidates = itertools.chain(
            candidates, recomputing_candidates(ranks, microbatches, costs, limit, recompute_input, chunks))
    pool = _tagged(candidates, origins)
    ranked = ranked_schedules(pool, costs, limit, objective)
    stored = [item for item in ranked if schedule_recompute(item[2]) is None]
    leaders = [item[2] for item in stored[:TOP_FOR_W_REPLACEMENT]]
    replaced = replaced_ranked(leaders, stored[0][0] if stored else None, costs, limit, objective, origins)
    best = _first(ranked[:1] + replaced)  # the pool's leader wins ties with a re-placed variant
    if best is None:
        if limit < SMALLEST_LIMIT - TOLERANCE:
            raise ConfigError(
                f"zb-auto: no schedule fits memory_limit={limit:g}, even recomputing activations: the "
                f"leanest needs {leanest_recomputing_need(ranks, microbatches, costs, recompute_input, chunks):.4g}"
            )
        raise RuntimeError(f"zb-auto: no candidate fits memory_limit={limit:g}")  # the 1-chunk greedy fits any limit >= 1
    schedule, result = best
    meta = {"origin": origins.get(id(schedule), "?"), "objective": objective, "memory_limit": limit}
    recompute = schedule_recompute(schedule)
    if recompute is not None:
        meta["recompute"] = recompute
        without = _first(stored[:1] + replaced)
        meta["without_recompute"] = objective_value(without[1], objective) if without is not None else None
    elif milp and time_limit > 0 and ranks * microbatches <= MILP_MAX_SIZE:
        if objective_value(result, objective) > work_bound(schedule, costs, objective) * (1 + TOLERANCE):
            polished = improve_by_swaps(schedule, costs, limit, objective, time_limit / 2)
            if polished.orders != schedule.orders:
                schedule = polished
                meta["origin"] += " + swaps"
        found = refine(schedule, costs, limit, objective, time_limit / 2)
        meta["milp"] = {
            "status": found.status, "greedy": found.greedy_value, "best": found.best_value,
            "lower_bound": found.lower_bound, "gap": found.gap, "seconds": found.seconds,
        }
        if found.schedule is not None:
            schedule = found.schedule
            meta["origin"] += " + MILP"
    return Schedule(schedule.ranks, schedule.microbatches, schedule.placement, schedule.orders,
                    name="zb-auto", meta=meta)


def build(request: BuildRequest) -> Schedule:
    """The registry's builder (``chunks=None``: the search picks 1 or 2 stages per rank)."""
    r = request
    return build_auto(r.ranks, r.microbatches, r.costs, r.memory_limit, r.objective, chunks=r.chunks,
                      recompute_input=r.recompute_input)


def search_width(ranks: int, microbatches: int, chunks: Optional[int] = None) -> int:
    """The most schedules :func:`build_auto` simulates without searching recomputation: every
    candidate (with ``chunks`` per rank, if given), the best few again with their W passes
    re-placed (each charged as ``REPLACEMENT_COST`` schedules: the W placement executes the whole
    program before it is simulated), and on small instances (``MILP_MAX_SIZE``) the swaps'
    evaluations and the exact refinement's two. A request that searches recomputation simulates
    :func:`~.recompute.recompute_width` more."""

    width = candidate_count(ranks, microbatches, chunks)
    width += REPLACEMENT_COST * len(FILL_PARTIAL_WAITS) * TOP_FOR_W_REPLACEMENT
    if ranks * microbatches <= MILP_MAX_SIZE:
        width += 1 + SWAP_EVALUATIONS + 2
    return width


def _first(ranked: list):
    """(schedule, SimResult) of the best of ranked entries (earlier entries win ties), or None."""
    if not ranked:
        return None
    _, _, schedule, result = min(enumerate(ranked), key=lambda pair: (pair[1][0], pair[0]))[1]
    return schedule, result


def _tagged(pairs, origins: dict):
    """Yield the schedules of (origin, schedule) pairs, noting each one's origin by id."""
    for origin, schedule in pairs:
        note_origin(origins, schedule, origin)  # one V program offered twice: the first, which wins ties
        yield schedule
