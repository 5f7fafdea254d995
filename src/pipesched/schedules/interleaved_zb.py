"""Interleaved Zero Bubble: loop placement with ``v`` chunks per rank and a split backward.

Interleaving shrinks the warm-up bubble by ``v``; splitting the backward lets the weight passes
(W) fill what is left. The forwards and input-gradient backwards follow the interleaved 1F1B
table (:mod:`.interleaved`); each W then goes right after its I, or into the waits (:mod:`.wfill`),
deferred no further than the memory limit allows (default ``p``, the same as 1F1B). Warm-up
depth, group size and W placement are chosen by simulation under the given costs, preferring
candidates within the limit.
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
from .wfill import fill_weight_passes

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


def _lagged(order: list[Action], lag: int) -> list[Action]:
    """Each I followed by the W of the I ``lag`` places earlier (ZB-H1's deferral); rest at the end."""
    out: list[Action] = []
    done_i: list[Action] = []
    input_backward, weight_backward = Op.I, Op.W
    for action in order:
        out.append(action)
        if action.kind is input_backward:
            done_i.append(action)
            if len(done_i) > lag:
                w = done_i[len(done_i) - 1 - lag]
                out.append(Action(w.stage, weight_backward, w.microbatch))
    out.extend(Action(i.stage, weight_backward, i.microbatch) for i in done_i[max(0, len(done_i) - lag):])
    return out


def _weight_placements(skeleton, placement, microbatches, costs, limit):
    """Ways to place the Ws: after their I (now, or lagging by the rank), or into the waits."""
    ranks = len(skeleton)
    for lag_per_rank in W_LAGS_PER_RANK:
        orders = tuple(tuple(_lagged(order, lag_per_rank * r)) for r, order in enumerate(skeleton))
        yield Schedule(ranks, microbatches, placement, orders, name="interleaved-zb")
    for partial in FILL_PARTIAL_WAITS:
        try:
            yield fill_weight_passes(
                skeleton, placement, microbatches, costs, limit,
                name="interleaved-zb", fill_partial_waits=partial,
            )
        except DeadlockError:
            continue
