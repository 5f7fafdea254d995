"""The V family: two chunks per rank in a V, split backward, at a chosen memory budget.

- ``zb-v``: 1F1B's memory (``p``) by default, near-zero bubble; any limit is accepted.
- ``v-half``: about half of it, ``(p+2)//2``; bubble about half of 1F1B's.
- ``v-min``: about a third, ``(p+4)//3``; bubble about two thirds of 1F1B's.

Each builder simulates its candidates under the given costs and keeps the fastest whose peak
memory fits: the handcrafted program (:mod:`.zbv`, for ``zb-v``) or the building block
(:mod:`.v_blocks`, for ``v-half``/``v-min``), and the cost-aware greedy (:mod:`.greedy`) with
several switch settings at the same limit. The greedy's memory rule makes every limit from one
microbatch's activations upward feasible.
"""

from __future__ import annotations

import itertools
from typing import Iterator, Optional

from ..costs import UNIT, Costs
from ..placement import v_placement
from ..schedule import Schedule
from .choose import best_schedule, objective_value, work_bound
from .greedy import Knobs, build_greedy
from .limits import resolve_limit
from .v_blocks import block_orders, v_half_offsets, v_min_offsets
from .zbv import rank_order


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


def _finish(best, family: str, limit: float) -> Schedule:
    if best is None:  # the greedy always fits a limit >= 1; reaching here is a bug
        raise RuntimeError(f"{family}: no candidate fits memory_limit={limit:g}")
    schedule, _ = best
    if schedule.name == family:
        return schedule  # no copy: keeps the programs that simulating it already lowered
    return Schedule(schedule.ranks, schedule.microbatches, schedule.placement, schedule.orders, name=family)


def _from_orders(ranks: int, microbatches: int, orders, name: str) -> Schedule:
    return Schedule(ranks, microbatches, v_placement(ranks), tuple(tuple(o) for o in orders), name=name)


def build_zb_v(
    ranks: int,
    microbatches: int,
    chunks: int = 2,
    costs: Optional[Costs] = None,
    memory_limit: Optional[float] = None,
    objective: str = "makespan",
) -> Schedule:
    """ZB-V: the handcrafted program where it fits, else (or if faster) the greedy V."""
    costs = costs or UNIT
    limit = resolve_limit(memory_limit, ranks, "zb-v")
    handcrafted = _from_orders(ranks, microbatches, [rank_order(r, ranks, microbatches) for r in range(ranks)], "zb-v")
    if _meets_work_bound(handcrafted, costs, limit, objective):
        return handcrafted  # nothing can be faster (always so at equal costs): skip the search
    candidates = itertools.chain(
        [handcrafted], greedy_v_candidates(ranks, microbatches, costs, limit, "zb-v", v_knobs(ranks, microbatches))
    )
    return _finish(best_schedule(candidates, costs, limit, objective), "zb-v", limit)


def _meets_work_bound(schedule: Schedule, costs: Costs, limit: float, objective: str) -> bool:
    from ..simulate import simulate
    from ..validate import validate

    result = simulate(validate(schedule), costs)  # validated once; build_schedule reuses it
    return (result.max_peak_memory <= limit + 1e-9
            and objective_value(result, objective) <= work_bound(schedule, costs, objective) * (1 + 1e-9))


def v_half_limit(ranks: int) -> int:
    return (ranks + 2) // 2


def v_min_limit(ranks: int) -> int:
    return (ranks + 4) // 3


def _build_budgeted(ranks, microbatches, costs, memory_limit, objective, family, budget, offsets) -> Schedule:
    costs = costs or UNIT
    limit = resolve_limit(memory_limit, budget, family)
    limit = min(limit, float(budget))
    block = _from_orders(ranks, microbatches, block_orders(ranks, microbatches, offsets), family)
    reserves = tuple(range(1, max(2, int(limit)) + 1))[:4]
    knobs = v_knobs(ranks, microbatches, reserves)
    candidates = itertools.chain([block], greedy_v_candidates(ranks, microbatches, costs, limit, family, knobs))
    return _finish(best_schedule(candidates, costs, limit, objective), family, limit)


def _budgeted_family(family: str, budget_of, offsets, summary: str):
    def build(
        ranks: int,
        microbatches: int,
        chunks: int = 2,
        costs: Optional[Costs] = None,
        memory_limit: Optional[float] = None,
        objective: str = "makespan",
    ) -> Schedule:
        return _build_budgeted(ranks, microbatches, costs, memory_limit, objective, family,
                               budget_of(ranks), offsets)

    build.__name__ = f"build_{family.replace('-', '_')}"
    build.__doc__ = summary
    return build


build_v_half = _budgeted_family(
    "v-half", v_half_limit, v_half_offsets,
    "V-Half: peak ``(p+2)//2`` (or a lower ``memory_limit``), about half of 1F1B's bubble.",
)
build_v_min = _budgeted_family(
    "v-min", v_min_limit, v_min_offsets,
    "V-Min: peak ``(p+4)//3`` (or a lower ``memory_limit``), about two thirds of 1F1B's bubble.",
)
