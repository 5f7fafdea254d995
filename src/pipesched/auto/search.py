"""The candidates ``zb-auto`` chooses from: greedy constructions and the handcrafted schedules.

- the cost-aware greedy (:mod:`pipesched.schedules.greedy`) with one chunk per rank, under each
  setting of its switches (the Zero Bubble heuristic's search);
- the same greedy with two chunks per rank in a V;
- every handcrafted schedule of ours that fits the limit (1F1B, ZB-H1, ZB-H2 and interleaved ZB
  at the limit, ZB-V's program, the V-Half/V-Min blocks, ...), so the result is never worse;
- the best few again with their W passes re-placed for these costs
  (:func:`with_weights_replaced`): the handcrafted programs put W by a unit-cost rule.
"""

from __future__ import annotations

import itertools
from typing import Iterator, Optional

from ..costs import Costs
from ..errors import PipeschedError
from ..placement import loop_placement, v_placement
from ..schedule import Schedule
from ..schedules.greedy import Knobs, build_greedy
from ..schedules.v_blocks import block_orders, v_half_offsets, v_min_offsets
from ..schedules.v_compact import COMPACTION_COST, compacted_orders
from ..schedules.v_family import v_knobs
from ..schedules.wfill import fill_weight_passes
from ..schedules.zbv import rank_order

HANDCRAFTED = ("1f1b", "zb-h1", "zb-h2", "interleaved-zb", "interleaved-1f1b", "gpipe", "looped-bfs")
HOLD_EVERY_MICROBATCH = ("gpipe", "looped-bfs")
LARGE = 512  # ranks * microbatches above which fewer greedy settings are tried
HUGE = 4096  # ... and above which only two per placement


def loop_knobs(ranks: int, microbatches: int) -> list[Knobs]:
    """Greedy settings for one chunk per rank (the stage order and reserve do not matter there)."""
    if ranks * microbatches > HUGE:
        return [Knobs(True, False, False), Knobs(True, True, True)]
    bits = (True,) if ranks * microbatches > LARGE else (True, False)
    return [Knobs(first, wait, fill) for first, wait, fill in itertools.product(bits, (True, False), (True, False))]


def v_greedy_knobs(ranks: int, microbatches: int) -> list[Knobs]:
    """Greedy settings for two chunks per rank in a V."""
    if ranks * microbatches > HUGE:
        return [Knobs(True, True, True), Knobs(False, True, False)]
    return v_knobs(ranks, microbatches, large=LARGE)


def greedy_candidates(
    ranks: int, microbatches: int, costs: Costs, limit: float, chunks: Optional[int] = None
) -> Iterator[tuple[str, Optional[Schedule]]]:
    loop = loop_placement(ranks)
    if chunks in (None, 1):
        for k in loop_knobs(ranks, microbatches):
            yield f"greedy 1-chunk {_knob_text(k)}", build_greedy(loop, ranks, microbatches, costs, limit, k, "zb-auto")
    if chunks in (None, 2):
        v = v_placement(ranks)
        for k in v_greedy_knobs(ranks, microbatches):
            yield f"greedy V {_knob_text(k)}", build_greedy(v, ranks, microbatches, costs, limit, k, "zb-auto")


V_PROGRAMS = {  # the V programs among the handcrafted candidates: per-rank orders for (ranks, m)
    "zb-v": lambda ranks, m: [rank_order(r, ranks, m) for r in range(ranks)],
    "v-half block": lambda ranks, m: block_orders(ranks, m, v_half_offsets),
    "v-min block": lambda ranks, m: block_orders(ranks, m, v_min_offsets),
    "v-half compacted": lambda ranks, m: compacted_orders(ranks, m, v_half_offsets),
    "v-min compacted": lambda ranks, m: compacted_orders(ranks, m, v_min_offsets),
}


def handcrafted_candidates(ranks: int, microbatches: int, costs: Costs, limit: float) -> Iterator[tuple[str, Optional[Schedule]]]:
    from ..registry import get_family

    for name in HANDCRAFTED:
        family = get_family(name)
        if name in HOLD_EVERY_MICROBATCH and microbatches > limit:
            continue  # their peak is m
        try:
            schedule = family.build(
                ranks, microbatches, chunks=family.default_chunks, costs=costs,
                memory_limit=limit if family.uses_memory_limit else None,
            )
        except PipeschedError:
            continue
        yield name, schedule
    v = v_placement(ranks)
    for name, program in V_PROGRAMS.items():
        orders = program(ranks, microbatches)
        yield name, Schedule(ranks, microbatches, v, tuple(tuple(o) for o in orders), name=name)




def candidate_count(ranks: int, microbatches: int) -> int:
    """The most schedules :func:`all_candidates` builds and simulates, each handcrafted family's
    own search included (the cost of planning grows with it: see :mod:`pipesched.planning`)."""
    from ..registry import get_family

    handcrafted = sum(get_family(name).search_width(ranks, microbatches) for name in HANDCRAFTED)
    greedy = len(loop_knobs(ranks, microbatches)) + len(v_greedy_knobs(ranks, microbatches))
    compacted = sum(1 for name in V_PROGRAMS if name.endswith("compacted"))
    return handcrafted + len(V_PROGRAMS) + (COMPACTION_COST - 1) * compacted + greedy


def _knob_text(k: Knobs) -> str:
    on = [name for name, value in (
        ("backward-first", k.backward_first), ("wait-for-backward", k.wait_for_backward),
        ("fill-partial", k.fill_partial_gaps),
    ) if value]
    return "(" + ", ".join(on) + (f", reserve {k.reserve}" if k.reserve != 1 else "") + ")"


def with_weights_replaced(
    schedule: Schedule, costs: Costs, limit: float, fill_partial_waits: bool = False
) -> Optional[Schedule]:
    """The same forwards and input-gradient backwards, W passes put into this cost model's waits
    (``fill_partial_waits``: also into waits shorter than a W)."""
    if any(a.kind == "B" for _, a in schedule.actions()) or not schedule.split_backward:
        return None
    skeleton = [[a for a in schedule.rank_actions(r) if a.kind != "W"] for r in range(schedule.ranks)]
    return fill_weight_passes(skeleton, schedule.placement, schedule.microbatches, costs, limit,
                              schedule.name, fill_partial_waits=fill_partial_waits)


def all_candidates(
    ranks: int, microbatches: int, costs: Costs, limit: float, chunks: Optional[int] = None
) -> Iterator[tuple[str, Schedule]]:
    """Every candidate (with ``chunks`` per rank, if given) and where it came from."""
    for origin, schedule in itertools.chain(
        handcrafted_candidates(ranks, microbatches, costs, limit),
        greedy_candidates(ranks, microbatches, costs, limit, chunks),
    ):
        if schedule is not None and (chunks is None or schedule.chunks == chunks):
            yield origin, schedule
