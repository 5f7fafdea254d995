"""The V family: two chunks per rank in a V, split backward, at a chosen memory budget.

- ``zb-v``: 1F1B's memory (``p``) by default, near-zero bubble; any limit is accepted.
- ``v-half``: about half of it, ``(p+2)//2``; bubble about half of 1F1B's.
- ``v-min``: about a third, ``(p+4)//3``; bubble about two thirds of 1F1B's.

The three share one pool of candidates, simulated under the given costs; the fastest whose
peak fits the family's limit wins: ZB-V's handcrafted program (:mod:`.zbv`), the V-Half and
V-Min building blocks compacted as the paper's builder does (:mod:`.v_compact`) and repeated as
they are (:mod:`.v_blocks`), and the cost-aware greedy (:mod:`.greedy`) with several switch
settings at the limit. The family's own construction goes first, so it wins ties. The
greedy's memory rule makes every limit from one microbatch's activations upward feasible.
"""

from __future__ import annotations

import itertools
from typing import Iterator, Optional

from ..costs import Costs
from ..execution import TOLERANCE
from ..placement import v_placement
from ..schedule import Schedule
from ..simulate import simulate
from ..validate import validate
from ..ranking import objective_value
from .choose import best_schedule, work_bound
from .greedy import Knobs, build_greedy
from .limits import resolve_limit
from .v_blocks import block_orders, v_half_offsets, v_min_offsets
from .v_compact import COMPACTION_COST, compacted_orders
from .zbv import rank_order

MAX_RESERVES = 4  # the V-Half and V-Min greedy tries reserving 1..4 slots of memory


def v_knobs(
    ranks: int, microbatches: int, reserves: tuple[int, ...] = (1, 2), large: int = 512
) -> list[Knobs]:
    """Greedy settings worth trying for a V placement (fewer when ``ranks * microbatches > large``)."""
    if ranks * microbatches > large:
        return [Knobs(first, True, fill, True, 1) for first, fill in itertools.product((True, False), repeat=2)]
    return [
        Knobs(first, wait, fill, True, reserve)
        for first, wait, fill, reserve in itertools.product((True, False), (True, False), (True, False), reserves)
    ]


def greedy_v_candidates(
    ranks: int, microbatches: int, costs: Costs, limit: float, name: str, knobs: list[Knobs]
) -> Iterator[Optional[Schedule]]:
    placement = v_placement(ranks)
    for k in knobs:
        yield build_greedy(placement, ranks, microbatches, costs, limit, k, name)


def _from_orders(ranks: int, microbatches: int, orders, name: str) -> Schedule:
    return Schedule(ranks, microbatches, v_placement(ranks), tuple(tuple(o) for o in orders), name=name)


def v_candidates(
    ranks: int, microbatches: int, costs: Costs, limit: float, name: str, first: str,
    first_built: Optional[Schedule] = None,
) -> Iterator[Optional[Schedule]]:
    """Every V construction, ``first`` (``"zb-v"``, ``"v-half"`` or ``"v-min"``) ahead for ties
    (``first_built``: that one, already built).

    One pool for the three families: at any limit the best V schedule that fits wins, whichever
    family's construction made it (the ZB-V program fits a V-Half budget at small ``p``; a
    V-Min block can beat a V-Half one under skewed costs).
    """
    handcrafted = {
        "zb-v": lambda: [rank_order(r, ranks, microbatches) for r in range(ranks)],
        "v-half": lambda: compacted_orders(ranks, microbatches, v_half_offsets),
        "v-min": lambda: compacted_orders(ranks, microbatches, v_min_offsets),
    }
    for family in sorted(handcrafted, key=lambda f: f != first):
        if family == first and first_built is not None:
            yield first_built
        else:
            yield _from_orders(ranks, microbatches, handcrafted[family](), name)
    for offsets in (v_half_offsets, v_min_offsets):
        yield _from_orders(ranks, microbatches, block_orders(ranks, microbatches, offsets), name)
    reserves = tuple(range(1, min(max(2, int(limit)), MAX_RESERVES) + 1))  # never a huge limit's range
    yield from greedy_v_candidates(ranks, microbatches, costs, limit, name, v_knobs(ranks, microbatches, reserves))


def build_zb_v(ranks: int, microbatches: int, costs: Costs, memory_limit: Optional[float], objective: str) -> Schedule:
    """ZB-V: the handcrafted program where it fits, else (or if faster) the best V construction."""
    limit = resolve_limit(memory_limit, ranks, "zb-v")
    handcrafted = _from_orders(ranks, microbatches, [rank_order(r, ranks, microbatches) for r in range(ranks)], "zb-v")
    if _meets_work_bound(handcrafted, costs, limit, objective):
        return handcrafted  # nothing can be faster (always so at equal costs): skip the search
    return _best_v(ranks, microbatches, costs, limit, objective, "zb-v", first_built=handcrafted)


def build_budgeted(
    family: str, ranks: int, microbatches: int, costs: Costs, memory_limit: Optional[float], objective: str,
) -> Schedule:
    """V-Half or V-Min (``family``): the fastest V schedule within the family's budget
    (:data:`BUDGETS`), or within a lower ``memory_limit``."""
    budget = BUDGETS[family](ranks)
    limit = min(resolve_limit(memory_limit, budget, family), float(budget))
    return _best_v(ranks, microbatches, costs, limit, objective, family)


def _best_v(
    ranks: int, microbatches: int, costs: Costs, limit: float, objective: str, family: str,
    first_built: Optional[Schedule] = None,
) -> Schedule:
    """The fastest of the V pool (:func:`v_candidates`, ``family``'s own construction first)
    within ``limit``, named for ``family``."""
    best = best_schedule(v_candidates(ranks, microbatches, costs, limit, family, family, first_built),
                         costs, limit, objective)
    if best is None:  # the greedy always fits a limit >= 1; reaching here is a bug
        raise RuntimeError(f"{family}: no candidate fits memory_limit={limit:g}")
    schedule, _ = best
    if schedule.name == family:
        return schedule  # no copy: keeps the programs that simulating it already lowered
    return Schedule(schedule.ranks, schedule.microbatches, schedule.placement, schedule.orders, name=family)


def zb_v_searches(ranks: int, costs: Costs, memory_limit: Optional[float]) -> bool:
    """Whether :func:`build_zb_v` may search: not at equal costs (F = B = W, no comm, no stage
    multipliers, no stage overhead) within ``p`` M_B, where its program meets the work bound (no order is faster)."""
    equal = (costs.F == costs.B == costs.W and costs.comm == 0 and costs.stage_overhead == 0
             and costs.full_backward is None
             and len(set(costs.stage_multipliers or (1.0,))) == 1)
    return not (equal and (memory_limit is None or memory_limit >= ranks))


def v_pool_width(ranks: int, microbatches: int) -> int:
    """The most schedules :func:`v_candidates` yields: three handcrafted programs (two of them
    compacted, each costing ``COMPACTION_COST`` schedules), two blocks, and one greedy V per
    setting at up to ``MAX_RESERVES`` reserves."""
    return 1 + 2 * COMPACTION_COST + 2 + len(v_knobs(ranks, microbatches, tuple(range(1, MAX_RESERVES + 1))))


def zb_v_search_width(ranks: int, microbatches: int) -> int:
    """The most schedules :func:`build_zb_v` simulates: its program against the work bound,
    then the whole V pool (its program again among them)."""
    return 1 + v_pool_width(ranks, microbatches)


def _meets_work_bound(schedule: Schedule, costs: Costs, limit: float, objective: str) -> bool:
    result = simulate(validate(schedule), costs)  # validated once; build_schedule reuses it
    return (result.max_peak_memory <= limit + TOLERANCE
            and objective_value(result, objective) <= work_bound(schedule, costs, objective) * (1 + TOLERANCE))


def v_half_limit(ranks: int) -> int:
    """V-Half's peak, ``(p+2)//2`` M_B: about half of 1F1B's activations and half its bubble."""
    return (ranks + 2) // 2


def v_min_limit(ranks: int) -> int:
    """V-Min's peak, ``(p+4)//3`` M_B: about a third of 1F1B's activations, two thirds of its bubble."""
    return (ranks + 4) // 3


BUDGETS = {"v-half": v_half_limit, "v-min": v_min_limit}  # the budgeted families' peaks, from p
