"""Interleaved Zero Bubble: loop placement with ``v`` chunks per rank and a split backward.

Interleaving shrinks the warm-up bubble by ``v``; splitting the backward lets the weight passes
(W) fill what is left. The forwards and input-gradient backwards follow the interleaved 1F1B
table (:mod:`.interleaved`); each W then goes right after its I, or into the waits (:mod:`.wfill`),
deferred no further than the memory limit allows (default ``p``, the same as 1F1B). Warm-up
depth, group size and W placement are chosen by their times under the given costs (simulated, or
known from the fill: :class:`~.wfill.Built`), preferring candidates within the limit.
"""

from __future__ import annotations

from typing import Optional

from ..actions import Action
from ..ops import Op
from ..costs import Costs
from ..errors import DeadlockError
from ..placement import loop_placement
from ..schedule import Schedule
from .interleaved import group_candidates, pick_fastest, rank_order
from .wfill import fill, prepare

WARMUPS_PER_HOP = (1, 2)  # forwards in flight per hop during warm-up
W_LAGS_PER_RANK = (0, 1)  # each W right after its I, or ZB-H1's lag of one I per rank
FILL_PARTIAL_WAITS = (False, True)  # Ws into the waits: only those a W fits, or every wait


def search_width(ranks: int, microbatches: int) -> int:
    """How many candidate schedules :func:`build` builds and simulates."""
    placements = len(W_LAGS_PER_RANK) + len(FILL_PARTIAL_WAITS)
    return len(WARMUPS_PER_HOP) * len(group_candidates(ranks, microbatches)) * placements


def build(ranks: int, microbatches: int, chunks: int, costs: Costs, memory_limit: Optional[float]) -> Schedule:
    """Interleaved ZB: the fastest candidate whose peak memory fits ``memory_limit``."""
    limit = float(memory_limit) if memory_limit is not None else float(ranks)
    placement = loop_placement(ranks, chunks)

    def candidates():
        for warmup_per_hop in WARMUPS_PER_HOP:
            for group in group_candidates(ranks, microbatches):
                skeleton = [
                    rank_order(r, ranks, microbatches, chunks, group, warmup_per_hop, backward=Op.I)
                    for r in range(ranks)
                ]
                yield from _weight_placements(skeleton, placement, microbatches, costs, limit)

    return pick_fastest(candidates(), costs, limit)


def _weight_placements(skeleton, placement, microbatches, costs, limit):
    """Ways to place the Ws: after their I (now, or lagging by the rank), or into the waits;
    each with its times and peak (:class:`~.wfill.Built`: none needs a simulation)."""
    prepared = prepare(skeleton, placement, costs)
    ways = [{"lags": [lag_per_rank * r for r in range(len(skeleton))]} for lag_per_rank in W_LAGS_PER_RANK]
    ways += [{"fill_partial_waits": partial} for partial in FILL_PARTIAL_WAITS]
    for way in ways:
        try:
            yield fill(prepared, microbatches, limit, name="interleaved-zb", **way)
        except DeadlockError:
            continue
