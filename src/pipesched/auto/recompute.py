"""zb-auto's recomputation dimension: faster orders brought within the limit by recomputing.

Under a memory limit, zb-auto's pool fits by keeping fewer microbatches in flight (the greedy
at the limit, V-Half's and V-Min's blocks). Recomputing a stage's activations (activation
checkpointing) is the other way down: the stage keeps only its input between its forward and
its backward, and re-runs its forward first, so each of its ``I``/``B`` takes ``F`` longer.

For each of a few relaxed limits above the limit (1F1B's ``p`` and the nearest few of its
halvings: :func:`relaxed_limits`) this module
offers the greedy's schedule at that limit, loop and V, with every ``W`` moved right after its
``I`` (a recomputed stage's ``I`` rebuilds the whole W stash: freeing it at once is what lets a
V schedule go below one microbatch's activations; measured, the greedy's own W placement never
won) and the stages of every rank over the limit recomputed. Memory is per rank and depends only on the rank's own order, so those are
the fewest stages, rank by rank, that can bring the schedule within the limit (with one chunk
per rank: the early ranks, which hold the most microbatches in flight). zb-auto ranks these with
its pool by the one ranking rule, after the pool on ties: recomputation wins only where it is
faster than the leaner schedules at the same limit.
"""

from __future__ import annotations

from typing import Iterator, Optional

from ..costs import Costs
from ..execution import TOLERANCE
from ..memory import Recompute, unit_peak
from ..ops import Op
from ..placement import loop_placement, stages_by_rank, v_placement
from ..schedule import Schedule
from ..schedules.greedy import build_greedy
from .search import loop_knobs, v_greedy_knobs


MOST_RELAXED_LIMITS = 4  # p, and the three halvings nearest above the limit (p <= 8: all of them)


def relaxed_limits(ranks: int, limit: float) -> list[int]:
    """The limits the recomputing candidates are built at, highest first: of ``p``,
    ``ceil(p/2)``, ... down to 1, those above ``limit``: ``p`` and the nearest few."""
    halvings = [ranks]
    while halvings[-1] > 1:
        halvings.append((halvings[-1] + 1) // 2)
    above = [x for x in halvings if x > limit + TOLERANCE]
    return above[:1] + above[1:][-(MOST_RELAXED_LIMITS - 1):]


def recompute_width(ranks: int, limit: float) -> int:
    """The most recomputing candidates offered (and simulated) under ``limit``: two placements
    per relaxed limit (zb-auto's ``recompute_search_width``: counted only when recomputation is
    searched)."""
    return 2 * len(relaxed_limits(ranks, limit))


def weights_eager(orders) -> tuple[tuple, ...]:
    """Each rank's order with every ``W`` moved to right after its ``I`` (nothing waits for a
    ``W``, so this never deadlocks; it frees each stash as early as the order allows)."""
    eager = []
    for order in orders:
        weights = {(a.stage, a.microbatch): a for a in order if a.kind is Op.W}
        moved = []
        for a in order:
            if a.kind is Op.W:
                continue
            moved.append(a)
            if a.kind is Op.I:
                moved.append(weights[(a.stage, a.microbatch)])
        eager.append(tuple(moved))
    return tuple(eager)



def recomputing_candidates(
    ranks: int, microbatches: int, costs: Costs, limit: float, input_share: float, chunks: Optional[int] = None
) -> Iterator[tuple[str, Schedule]]:
    """(origin, schedule) for each greedy schedule above ``limit`` that recomputing the stages of
    its ranks over the limit brings within it; the schedule carries that in ``meta["recompute"]``."""
    placements = [(name, placement, knobs) for name, placement, knobs, v in (
        ("1-chunk", loop_placement(ranks), loop_knobs(ranks, microbatches)[0], 1),
        ("V", v_placement(ranks), v_greedy_knobs(ranks, microbatches)[0], 2),
    ) if chunks in (None, v)]
    for relaxed in relaxed_limits(ranks, limit):  # (at or below the limit, the pool covers it)
        for name, placement, knobs in placements:
            built = build_greedy(placement, ranks, microbatches, costs, relaxed, knobs, "zb-auto")
            if built is None:
                continue
            held = stages_by_rank(placement, ranks)
            orders = weights_eager(built.orders)
            over = [r for r in range(ranks) if unit_peak(orders[r], len(held[r])) > limit + TOLERANCE]
            if not over:
                continue  # it fits as it is: the pool's own candidates cover it
            chosen = Recompute(frozenset(s for r in over for s in held[r]), input_share)
            if any(unit_peak(orders[r], len(held[r]), chosen) > limit + TOLERANCE for r in over):
                continue  # even recomputing every stage of these ranks is not enough
            origin = (f"greedy {name} at limit {relaxed}, Ws eager, recomputing on ranks "
                      f"{','.join(map(str, over))} (above {limit:g} M_B otherwise)")
            yield origin, Schedule(ranks, microbatches, placement, orders, name="zb-auto",
                                   meta={"recompute": chosen})


def leanest_recomputing_need(
    ranks: int, microbatches: int, costs: Costs, input_share: float, chunks: Optional[int] = None
) -> float:
    """The least peak (M_B) the leanest greedy orders reach with every stage recomputed: what a
    limit no candidate meets should be raised to."""
    needs = []
    for placement, knobs, v in ((loop_placement(ranks), loop_knobs(ranks, microbatches)[0], 1),
                                (v_placement(ranks), v_greedy_knobs(ranks, microbatches)[0], 2)):
        built = build_greedy(placement, ranks, microbatches, costs, 1.0, knobs, "zb-auto") if chunks in (None, v) else None
        if built is not None:
            held = stages_by_rank(placement, ranks)
            everything = Recompute(frozenset(range(len(placement))), input_share)
            orders = weights_eager(built.orders)
            needs.append(max(unit_peak(orders[r], len(held[r]), everything) for r in range(ranks)))
    return min(needs)
