"""Interleaved 1F1B (Megatron's virtual pipeline) and looped breadth-first.

Each rank holds ``v`` chunks in loop placement (stage ``c*p + r`` on rank ``r``), so a microbatch
crosses every rank ``v`` times in smaller steps and the warm-up and cool-down shrink by ``v``:
bubble ``(p-1)(F+B+W)/v``, at the price of ``v`` times more point-to-point messages.

Order (Megatron's schedule table): microbatches go in groups of ``G`` (a last, smaller group takes the
remainder); within a group all chunk-0
forwards come first, then chunk 1, and so on; backwards follow the same table with the chunks
reversed. Rank ``r`` runs ``2(p-r-1) + (v-1)G`` warm-up forwards, then alternates one forward
and one backward. With ``p`` dividing ``m``, ``G = p`` gives Megatron's schedule exactly. For
other ``m`` (which Megatron's old code and torch refuse in many cases) every feasible ``G`` is a
valid schedule; we simulate a few and keep the fastest under the given costs (within the memory
limit, when one is given). Where the chunks differ in cost (a layer count that does not split
evenly) ``G = p`` makes each rank's heavy and light chunks alternate out of step with its
neighbours', which a larger group largely avoids: there, under a memory limit, the largest group
Megatron accepts up to ``2p`` (``microbatch_group_size_per_vp_stage``: ``m % G`` 0 or at least
``p``) is tried for every ``m``; it holds more microbatches in flight.

Looped BFS (breadth-first) runs every microbatch through one chunk before the next: the same
bubble, but memory grows with ``m`` like GPipe.
"""

from __future__ import annotations

from typing import Optional

from ..actions import Action
from ..ops import Op
from ..costs import Costs
from ..errors import DeadlockError
from ..placement import loop_placement
from ..ranking import rank_key, significant
from ..schedule import Schedule
from ..simulate import simulate
from .wfill import Built


def schedule_table(microbatches: int, chunks: int, group: int) -> list[tuple[int, int]]:
    """Megatron's forward order of (chunk, microbatch): groups of ``group`` microbatches, each
    group chunk by chunk; a last, smaller group holds the remainder."""
    group = max(1, min(group, microbatches))
    table = []
    for first in range(0, microbatches, group):
        last = min(first + group, microbatches)
        for chunk in range(chunks):
            table.extend((chunk, k) for k in range(first, last))
    return table


def rank_order(
    rank: int,
    ranks: int,
    microbatches: int,
    chunks: int,
    group: int,
    warmup_per_hop: int = 2,
    backward: Op = Op.B,
) -> list[Action]:
    """Rank ``rank``'s program: warm-up forwards, then one forward and one backward in turn.

    ``backward`` is ``Op.B`` (full) or ``Op.I`` (input gradient only; the caller adds the ``W``s).
    """
    table = schedule_table(microbatches, chunks, group)
    forward = Op.F
    forwards = [Action(c * ranks + rank, forward, k) for c, k in table]
    backwards = [Action((chunks - 1 - c) * ranks + rank, backward, k) for c, k in table]
    total = len(table)
    warmup = min(warmup_per_hop * (ranks - rank - 1) + (chunks - 1) * min(group, microbatches), total)
    order = forwards[:warmup]
    next_forward = warmup
    for b in backwards:
        if next_forward < total:
            order.append(forwards[next_forward])
            next_forward += 1
        order.append(b)
    return order


def group_candidates(ranks: int, microbatches: int, limit: int = 8, larger: bool = False) -> list[int]:
    """Group sizes worth trying: ``p`` when it divides ``m`` (with ``larger``, also the largest
    group up to ``2p`` that Megatron accepts: the one that keeps uneven chunks in step, and one
    more build at most, so that planning sizes barely move), else a few around ``p`` and ``m``."""
    if microbatches % ranks == 0:
        accepted = [g for g in range(ranks, min(microbatches, 2 * ranks) + 1)
                    if microbatches % g == 0 or microbatches % g >= ranks]
        return sorted({ranks, accepted[-1]}) if larger else [ranks]
    if microbatches < ranks:
        return [microbatches]
    span = list(range(ranks, min(microbatches, 2 * ranks - 1) + 1))
    if len(span) > limit:
        step = len(span) / limit
        span = sorted({span[int(i * step)] for i in range(limit)} | {ranks})
    return sorted(set(span) | {microbatches})


def interleaved_search_width(ranks: int, microbatches: int) -> int:
    """How many candidate schedules :func:`build_interleaved` builds at most: one per group
    size (the larger group counted, as under a memory limit)."""
    return len(group_candidates(ranks, microbatches, larger=True))


def pick_fastest(candidates, costs: Costs, memory_limit: float) -> Schedule:
    """The best candidate under ``costs`` by makespan (:func:`~pipesched.ranking.result_key`)
    within ``memory_limit``, else the one least over it; skips deadlocks; earlier ones win ties.
    A candidate is a :class:`Schedule`, simulated, or a :class:`~.wfill.Built`, which knows its
    times and peak under ``costs`` (what simulation would give it)."""
    best, best_key = None, None
    for candidate in candidates:
        if isinstance(candidate, Built):
            schedule, makespan, span, peak = candidate
        else:
            schedule = candidate
            try:
                result = simulate(schedule, costs)
            except DeadlockError:
                continue
            makespan, span, peak = result.makespan, result.span, result.max_peak_memory
        key = (significant(max(0.0, peak - memory_limit)), *rank_key(makespan, span, peak, "makespan"))
        if best_key is None or key < best_key:
            best, best_key = schedule, key
    if best is None:
        raise RuntimeError("no candidate schedule is free of deadlock")  # a bug, never bad input
    return best


def build_interleaved(ranks: int, microbatches: int, chunks: int, costs: Costs, memory_limit: Optional[float]) -> Schedule:
    """Interleaved 1F1B, Megatron order, the best group size for ``m`` under ``costs``.

    Larger groups hold more microbatches in flight: with ``memory_limit`` the fastest group
    within it wins (with chunks of unequal cost, the largest group Megatron accepts up to ``2p``
    included: see the module doc); without, the fastest (ties to the leaner). When ``p`` divides ``m``
    and no limit is given the group is ``p`` and the peak is Megatron's ``(2(p-1) + (v-1)p + 1) / v``.
    """
    placement = loop_placement(ranks, chunks)
    candidates = []
    uneven = len(set(costs.multipliers(len(placement)))) > 1  # where larger groups can help
    for group in group_candidates(ranks, microbatches, larger=memory_limit is not None and uneven):
        orders = tuple(
            tuple(rank_order(r, ranks, microbatches, chunks, group)) for r in range(ranks)
        )
        candidates.append(
            Schedule(ranks, microbatches, placement, orders, name="interleaved-1f1b", meta={"group": group})
        )
    if len(candidates) == 1:
        return candidates[0]
    return pick_fastest(candidates, costs, memory_limit if memory_limit is not None else float("inf"))


def build_looped_bfs(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    """Breadth-first: chunk by chunk, all microbatches forward; then backward in reverse chunks."""
    orders = []
    for r in range(ranks):
        forward, backward = Op.F, Op.B
        order = [Action(c * ranks + r, forward, k) for c in range(chunks) for k in range(microbatches)]
        order += [Action(c * ranks + r, backward, k) for c in reversed(range(chunks)) for k in range(microbatches)]
        orders.append(tuple(order))
    return Schedule(ranks, microbatches, loop_placement(ranks, chunks), tuple(orders), name="looped-bfs")
