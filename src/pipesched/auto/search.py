"""The candidates ``zb-auto`` chooses from: greedy constructions and the handcrafted schedules.

- the cost-aware greedy (:mod:`pipesched.schedules.greedy`) with one chunk per rank, under each
  setting of its switches (the Zero Bubble heuristic's search);
- the same greedy with two chunks per rank in a V;
- the Zero Bubble authors' own heuristic, reimplemented (:mod:`pipesched.schedules.zb_heuristic`),
  so that zb-auto is never behind it on any costs and limit;
- every registered family that declares itself a seed (``Family.zb_auto``: 1F1B, ZB-H1, ZB-H2
  and interleaved ZB at the limit, ZB-V's program, the V-Half/V-Min blocks, ...), so the
  result is never worse than a handcrafted schedule that fits;
- the best few again with their W passes re-placed for these costs
  (:func:`with_weights_replaced`): the handcrafted programs put W by a unit-cost rule.
"""

from __future__ import annotations

import itertools
import math
from typing import Iterator, Optional

from ..costs import Costs
from ..errors import PipeschedError
from ..memory import schedule_recompute
from ..ops import Op
from ..placement import loop_placement, v_placement
from ..registry import BuildRequest, built, families
from ..schedule import Schedule
from ..schedules.greedy import Knobs, build_greedy, greedy_orders
from ..schedules.v_family import v_knobs, v_programs
from ..schedules.zb_heuristic import build_zb_heuristic
from ..schedules.wfill import fill_weight_passes

LARGE = 512  # ranks * microbatches above which fewer greedy settings are tried
HUGE = 4096  # ... and above which only two per placement
AUTHORS_COST = 3  # schedules the authors' heuristic is charged as: its eight runs took 1.3 CPU s at p = 64,
# m = 512 (benchmarks/RESULTS.md, issue 37 branch zbauto-speed), a simulation of one schedule 0.45-0.54


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
        yield "Zero Bubble authors' heuristic", build_zb_heuristic(ranks, microbatches, costs, limit)
    if chunks in (None, 2):
        v = v_placement(ranks)
        for k in v_greedy_knobs(ranks, microbatches):  # the V family's settings: often built and simulated there
            orders = greedy_orders(v, ranks, microbatches, costs, limit, k)
            yield f"greedy V {_knob_text(k)}", None if orders is None else v_programs.schedule(
                ranks, microbatches, orders, "zb-auto")


def handcrafted_candidates(ranks: int, microbatches: int, costs: Costs, limit: float,
                           chunks: Optional[int] = None) -> Iterator[tuple[str, Optional[Schedule]]]:
    """The seeds the registered families offer (``Family.zb_auto``), in their declared order;
    with ``chunks``, only those of families built at that many chunks (a seed is built at its
    family's default: the others' would be built only to be dropped)."""
    seeds = sorted(((seed, f) for f in families() for seed in f.zb_auto
                    if chunks is None or f.default_chunks == chunks), key=lambda pair: pair[0].order)
    for seed, family in seeds:
        request = BuildRequest(ranks, microbatches, family.default_chunks, costs,
                               limit if family.uses_memory_limit else None)
        if seed.programs is not None:
            yield from seed.programs(request)
            continue
        try:
            yield family.name, built(family, request)
        except PipeschedError:
            continue


def candidate_count(ranks: int, microbatches: int, chunks: Optional[int] = None) -> int:
    """The most schedules :func:`all_candidates` builds and simulates (with ``chunks`` per
    rank, if given: only the seeds and greedy placements of that count), each seed family's own
    search included, the authors' heuristic as ``AUTHORS_COST`` (the cost of planning grows with
    it: see :mod:`pipesched.planning`)."""
    seeds = sum(
        family.search_width(ranks, microbatches) if seed.programs is None else seed.width
        for family in families() for seed in family.zb_auto if chunks is None or family.default_chunks == chunks
    )
    authors = AUTHORS_COST  # the Zero Bubble authors' heuristic
    loop = len(loop_knobs(ranks, microbatches)) + authors if chunks in (None, 1) else 0
    v = len(v_greedy_knobs(ranks, microbatches)) if chunks in (None, 2) else 0
    return seeds + loop + v


def _knob_text(k: Knobs) -> str:
    on = [name for name, value in (
        ("backward-first", k.backward_first), ("wait-for-backward", k.wait_for_backward),
        ("fill-partial", k.fill_partial_gaps),
    ) if value]
    return "(" + ", ".join(on) + (f", reserve {k.reserve}" if k.reserve != 1 else "") + ")"


def with_weights_replaced(
    schedule: Schedule, costs: Costs, limit: float, fill_partial_waits: bool = False,
    give_up_after: float = math.inf,
) -> Optional[Schedule]:
    """The same forwards and input-gradient backwards, W passes put into this cost model's waits
    (``fill_partial_waits``: also into waits shorter than a W); None when the schedule does not
    split its backward, recomputes, or would end after ``give_up_after``."""
    if any(a.kind is Op.B for _, a in schedule.actions()) or not schedule.split_backward:
        return None
    if schedule_recompute(schedule) is not None:
        return None  # the W placement counts stored activations only
    skeleton = [[a for a in schedule.rank_actions(r) if a.kind is not Op.W] for r in range(schedule.ranks)]
    return fill_weight_passes(skeleton, schedule.placement, schedule.microbatches, costs, limit,
                              schedule.name, fill_partial_waits=fill_partial_waits, give_up_after=give_up_after)


def all_candidates(
    ranks: int, microbatches: int, costs: Costs, limit: float, chunks: Optional[int] = None
) -> Iterator[tuple[str, Schedule]]:
    """Every candidate (with ``chunks`` per rank, if given) and where it came from."""
    for origin, schedule in itertools.chain(
        handcrafted_candidates(ranks, microbatches, costs, limit, chunks),
        greedy_candidates(ranks, microbatches, costs, limit, chunks),
    ):
        if schedule is not None and (chunks is None or schedule.chunks == chunks):
            yield origin, schedule
