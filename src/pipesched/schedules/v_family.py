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
from collections import OrderedDict
from typing import Iterator, Optional

from ..actions import Action
from ..costs import Costs
from ..execution import TOLERANCE
from ..placement import v_placement
from ..schedule import Schedule
from ..simulate import SimResult, simulate
from ..validate import validate
from ..ranking import objective_value, result_key
from .choose import work_bound
from .greedy import Knobs, greedy_orders
from .limits import resolve_limit
from .v_blocks import block_orders, v_half_offsets, v_min_offsets
from .v_compact import COMPACTION_COST, compacted_orders
from .zbv import rank_order

Orders = tuple[tuple[Action, ...], ...]

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


class _VPrograms:
    """V programs as schedules, and their simulations, kept for the last few (ranks,
    microbatches, orders): one search prices the same V programs under the same costs for zb-v,
    v-half, v-min and zb-auto's V seeds (the handcrafted programs, and the greedy's wherever two
    limits give one cap), each a full simulation at p = 64, m = 512. A schedule keeps the name
    of the family that built it first (:func:`named` gives another family its own); the
    simulator keeps its runs on it, and :meth:`simulated` its results by costs."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.kept: OrderedDict = OrderedDict()

    def _entry(self, ranks: int, microbatches: int, orders: Orders, name: str) -> tuple[Schedule, dict]:
        key = (ranks, microbatches, orders)
        found = self.kept.get(key)
        if found is None:
            found = self.kept[key] = (Schedule(ranks, microbatches, v_placement(ranks), orders, name=name), {})
            if len(self.kept) > self.size:
                self.kept.popitem(last=False)
        else:
            self.kept.move_to_end(key)
        return found

    def schedule(self, ranks: int, microbatches: int, orders: Orders, name: str) -> Schedule:
        """The V schedule of ``orders`` (the one kept, if any)."""
        return self._entry(ranks, microbatches, orders, name)[0]

    def simulated(self, ranks: int, microbatches: int, orders: Orders, costs: Costs,
                  name: str) -> tuple[Schedule, SimResult]:
        """The V schedule of ``orders`` and its simulation under ``costs``."""
        schedule, results = self._entry(ranks, microbatches, orders, name)
        result = results.get(costs)
        if result is None:
            # simulated first: its run under ``costs`` finishing proves the programs free of
            # deadlock, so validate checks the structure only (validated first, it made a
            # unit-cost run of its own, as long as this one: p = 64, m = 512)
            result = results[costs] = simulate(schedule, costs)
            validate(schedule)
        return schedule, result

    def cache_clear(self) -> None:
        self.kept.clear()


v_programs = _VPrograms(16)  # the V pool of one layout: 5 programs, 4 greedy settings at each of 2 caps
simulated = v_programs.simulated


def named(schedule: Schedule, name: str) -> Schedule:
    """``schedule`` under ``name``: itself if it has that name, else a copy sharing what
    simulating it derived (:meth:`Schedule.renamed`)."""
    return schedule if schedule.name == name else schedule.renamed(name)


def v_candidates(
    ranks: int, microbatches: int, costs: Costs, limit: float, name: str, first: str,
) -> Iterator[Optional[tuple[Schedule, SimResult]]]:
    """Every V construction simulated (None: a greedy setting that got stuck), ``first``
    (``"zb-v"``, ``"v-half"`` or ``"v-min"``) ahead for ties.

    One pool for the three families: at any limit the best V schedule that fits wins, whichever
    family's construction made it (the ZB-V program fits a V-Half budget at small ``p``; a
    V-Min block can beat a V-Half one under skewed costs).
    """
    handcrafted = {
        "zb-v": lambda: zb_v_orders(ranks, microbatches),
        "v-half": lambda: compacted_orders(ranks, microbatches, v_half_offsets),
        "v-min": lambda: compacted_orders(ranks, microbatches, v_min_offsets),
    }
    for family in sorted(handcrafted, key=lambda f: f != first):
        yield simulated(ranks, microbatches, handcrafted[family](), costs, name)
    for offsets in (v_half_offsets, v_min_offsets):
        yield simulated(ranks, microbatches, block_orders(ranks, microbatches, offsets), costs, name)
    reserves = tuple(range(1, min(max(2, int(limit)), MAX_RESERVES) + 1))  # never a huge limit's range
    placement = v_placement(ranks)
    for k in v_knobs(ranks, microbatches, reserves):
        orders = greedy_orders(placement, ranks, microbatches, costs, limit, k)
        yield None if orders is None else simulated(ranks, microbatches, orders, costs, name)


def zb_v_orders(ranks: int, microbatches: int) -> Orders:
    """ZB-V's handcrafted program (:mod:`.zbv`), every rank's."""
    return tuple(tuple(rank_order(r, ranks, microbatches)) for r in range(ranks))


def build_zb_v(ranks: int, microbatches: int, costs: Costs, memory_limit: Optional[float], objective: str) -> Schedule:
    """ZB-V: the handcrafted program where it fits, else (or if faster) the best V construction."""
    limit = resolve_limit(memory_limit, ranks, "zb-v")
    handcrafted, result = simulated(ranks, microbatches, zb_v_orders(ranks, microbatches), costs, "zb-v")
    if _meets_work_bound(handcrafted, result, costs, limit, objective):
        return named(handcrafted, "zb-v")  # nothing can be faster (always so at equal costs): skip the search
    return _best_v(ranks, microbatches, costs, limit, objective, "zb-v")


def build_budgeted(
    family: str, ranks: int, microbatches: int, costs: Costs, memory_limit: Optional[float], objective: str,
) -> Schedule:
    """V-Half or V-Min (``family``): the fastest V schedule within the family's budget
    (:data:`BUDGETS`), or within a lower ``memory_limit``."""
    budget = BUDGETS[family](ranks)
    limit = min(resolve_limit(memory_limit, budget, family), float(budget))
    return _best_v(ranks, microbatches, costs, limit, objective, family)


def _best_v(ranks: int, microbatches: int, costs: Costs, limit: float, objective: str, family: str) -> Schedule:
    """The fastest of the V pool (:func:`v_candidates`, ``family``'s own construction first)
    within ``limit``, named for ``family``; earlier candidates win ties."""
    fitting = [
        (result_key(result, objective), order, schedule)
        for order, (schedule, result) in enumerate(c for c in v_candidates(ranks, microbatches, costs, limit, family, family)
                                                   if c is not None)
        if result.max_peak_memory <= limit + TOLERANCE
    ]
    if not fitting:  # the greedy always fits a limit >= 1; reaching here is a bug
        raise RuntimeError(f"{family}: no candidate fits memory_limit={limit:g}")
    return named(min(fitting, key=lambda item: item[:2])[2], family)


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


def _meets_work_bound(schedule: Schedule, result: SimResult, costs: Costs, limit: float, objective: str) -> bool:
    return (result.max_peak_memory <= limit + TOLERANCE
            and objective_value(result, objective) <= work_bound(schedule, costs, objective) * (1 + TOLERANCE))


def v_half_limit(ranks: int) -> int:
    """V-Half's peak, ``(p+2)//2`` M_B: about half of 1F1B's activations and half its bubble."""
    return (ranks + 2) // 2


def v_min_limit(ranks: int) -> int:
    """V-Min's peak, ``(p+4)//3`` M_B: about a third of 1F1B's activations, two thirds of its bubble."""
    return (ranks + 4) // 3


BUDGETS = {"v-half": v_half_limit, "v-min": v_min_limit}  # the budgeted families' peaks, from p
