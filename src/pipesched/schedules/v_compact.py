"""Repeat, compact, squeeze: the controllable-memory paper's construction of V-Half and V-Min.

Qi et al. (NeurIPS 2024) build a V schedule from a building block (:mod:`.v_blocks`): repeat it
every 6 unit slots, then improve the result without raising its peak memory. A repeated block
is shaped for the steady state; in the warm-up and the cool-down it leaves slots idle that an
earlier pass could use. This module, our reading of the authors' greedy builder:

1. **repeat** the block ``m`` times and put each ``W`` into the first free slot after pending
   backwards (one queue: a W frees memory whichever chunk it belongs to);
2. **compact** the warm-up (before rank 0 finishes microbatch 0) and the cool-down (after rank
   0's last forward): in time order, each pass moves to the earliest free slot after its inputs
   whose move keeps the rank's peak (the steady state is left as the block made it);
3. **squeeze**: run the passes as early as their inputs allow at unit cost; those times become
   the new slots;
4. drop the ``W`` passes and compact the cool-down again (Ws now implicit: a pending one frees
   memory at every free slot), then put the ``W``s back, each chunk's in its own queue.

The per-rank programs are the passes sorted by slot; the simulator times them under any costs.
Every move respects the dependencies of the slot timetable, so the programs cannot deadlock.
"""

from __future__ import annotations

from functools import lru_cache

from ..actions import Action
from ..memory import UNIT_CHANGE
from ..ops import Op
from .v_blocks import PERIOD

# Building a compacted program costs about as much as two schedules built and simulated: the
# compaction scans free slots per pass (30 us per action at p=256, m=180, against 8-15 for a
# build and a simulation); pipesched.planning counts it so
COMPACTION_COST = 2

F0, F1, I1, I0, W1, W0 = range(6)  # the passes of one rank, in the block's column order
_FORWARDS = (F0, F1)
FORWARD_TAKES = int(UNIT_CHANGE[Op.F])  # +1 chunk unit
WEIGHT_PASS_FREES = int(UNIT_CHANGE[Op.W])  # -1
_BACKWARDS = (I1, I0)

Timetable = list[list[list[int]]]  # [rank][pass][microbatch] -> slot


@lru_cache(maxsize=4)
def compacted_orders(ranks: int, microbatches: int, offsets) -> tuple[tuple[Action, ...], ...]:
    """Per-rank programs of the block ``offsets`` after repeat, compact and squeeze.

    A pure function of its arguments, kept for the last few sizes: one search asks for the
    same programs from zb-v, v-half, v-min and zb-auto's seeds (the compaction is the V
    family's costliest step at p = 64, m = 512)."""
    table = [
        [[slot + PERIOD * j for j in range(microbatches)] for slot in offsets(ranks, rank)]
        for rank in range(ranks)
    ]
    table = [_with_weights(rank_slots, split=False) for rank_slots in table]
    table = _squeeze(_compact(table, ranks, microbatches, weights_explicit=True), ranks, microbatches)
    table = [rank_slots[:4] for rank_slots in table]
    table = _compact(table, ranks, microbatches, weights_explicit=False)
    table = [_with_weights(rank_slots[:4], split=True) for rank_slots in table]
    return tuple(tuple(_programs(rank, ranks, table[rank])) for rank in range(ranks))


def _with_weights(rank_slots: list[list[int]], split: bool) -> list[list[int]]:
    """Add W slots: at each free slot one pending W runs (chunk 1's first when ``split``)."""
    busy = {t: kind for kind in range(4) for t in rank_slots[kind]}
    end = max(busy)
    queues = [[], []] if split else [[]]
    pending = [0, 0]
    for t in range(end + 1):
        kind = busy.get(t)
        if kind in _BACKWARDS:
            pending[(kind - I1) if split else 0] += 1
        elif kind is None:
            for q, queue in enumerate(queues):
                if pending[q]:
                    queue.append(t)
                    pending[q] -= 1
                    break
    for q, queue in enumerate(queues):
        for _ in range(pending[q]):
            end += 1
            queue.append(end)
    return [list(s) for s in rank_slots[:4]] + queues


def _memory_profile(rank_slots: list[list[int]], length: int) -> list[int]:
    """Activations held after each slot (chunk units, what :mod:`pipesched.memory` says F and W
    take and free; I frees nothing in M_B); implicit Ws without W slots."""
    delta = [0] * length
    for kind in _FORWARDS:
        for t in rank_slots[kind]:
            delta[t] += FORWARD_TAKES
    explicit = len(rank_slots) > 4
    if explicit:
        for queue in rank_slots[4:]:
            for t in queue:
                delta[t] += WEIGHT_PASS_FREES
    else:
        busy = set(t for kind in range(4) for t in rank_slots[kind])
        backward_slots = sorted(t for kind in _BACKWARDS for t in rank_slots[kind])
        pending = i = 0
        for t in range(length):
            while i < len(backward_slots) and backward_slots[i] == t:
                pending += 1
                i += 1
            if t not in busy and pending:
                pending -= 1
                delta[t] += WEIGHT_PASS_FREES
    profile, level = [], 0
    for d in delta:
        level += d
        profile.append(level)
    return profile


def _inputs_slot(table: Timetable, rank: int, kind: int, k: int, ranks: int) -> int:
    """The latest slot among what pass ``kind`` of microbatch ``k`` on ``rank`` waits for."""
    mine = table[rank]
    latest = -1
    if kind in (F0, I1) and rank > 0:
        latest = table[rank - 1][kind][k]
    if kind in (F1, I0) and rank < ranks - 1:
        latest = max(latest, table[rank + 1][kind][k])
    if kind in (F1, I1, I0):
        latest = max(latest, mine[kind - 1][k])  # the pass before it in the V, on this rank
    if kind >= W1:
        backward = sorted(mine[I1] + mine[I0]) if len(mine) == 5 else mine[I1 if kind == W1 else I0]
        latest = max(latest, backward[k])
    if k > 0:
        latest = max(latest, mine[kind][k - 1])
    return latest


def _compact(table: Timetable, ranks: int, microbatches: int, weights_explicit: bool) -> Timetable:
    """Move warm-up (if ``weights_explicit``) and cool-down passes earlier, keeping each peak."""
    table = [[list(s) for s in rank_slots] for rank_slots in table]
    length = max(t for rank_slots in table for s in rank_slots for t in s) + 2
    profiles = [_memory_profile(rank_slots, length) for rank_slots in table]
    peak = max(max(p) for p in profiles)
    occupied = [set() for _ in range(ranks)]
    passes = sorted(
        (t, rank, kind, k)
        for rank, rank_slots in enumerate(table)
        for kind, slots in enumerate(rank_slots)
        for k, t in enumerate(slots)
    )
    phase = "warm-up"
    for t, rank, kind, k in passes:
        if phase == "warm-up" and kind == I0 and rank == 0:
            phase = "steady"
        if phase == "steady":
            if kind == F0 and k == microbatches - 1:
                phase = "cool-down"
            occupied[rank].add(t)
            continue
        if phase == "warm-up" and not weights_explicit:
            occupied[rank].add(t)
            continue
        earliest = _inputs_slot(table, rank, kind, k, ranks) + 1
        for slot in range(earliest, t):
            if slot in occupied[rank]:
                continue
            if _fits(table, profiles, rank, kind, k, slot, peak, length):
                break
        occupied[rank].add(table[rank][kind][k])
    return table


def _fits(table, profiles, rank, kind, k, slot, peak, length) -> bool:
    """Move the pass to ``slot`` if the rank's peak stays within ``peak`` (else leave it)."""
    old = table[rank][kind][k]
    profile = profiles[rank]
    if len(table[rank]) > 4 and kind not in _FORWARDS:
        table[rank][kind][k] = slot
        if kind >= W1:  # an earlier W frees memory earlier: the peak cannot rise
            for t in range(slot, old):
                profile[t] -= 1
        return True
    if len(table[rank]) > 4:  # an earlier F holds one more activation from slot to old
        if max(profile[slot:old]) + 1 > peak:
            return False
        for t in range(slot, old):
            profile[t] += 1
        table[rank][kind][k] = slot
        return True
    table[rank][kind][k] = slot
    moved = _memory_profile(table[rank], length)
    if max(moved) > peak:
        table[rank][kind][k] = old
        return False
    profiles[rank] = moved
    return True


def _squeeze(table: Timetable, ranks: int, microbatches: int) -> Timetable:
    """Unit-cost start times of the passes run in slot order as early as their inputs allow."""
    order = sorted(
        (t, rank, kind, k)
        for rank, rank_slots in enumerate(table)
        for kind, slots in enumerate(rank_slots)
        for k, t in enumerate(slots)
    )
    squeezed = [[[0] * len(slots) for slots in rank_slots] for rank_slots in table]
    free = [0] * ranks
    for _t, rank, kind, k in order:
        start = max(free[rank], _inputs_slot(squeezed, rank, kind, k, ranks) + 1)
        squeezed[rank][kind][k] = start
        free[rank] = start + 1
    return squeezed


def _programs(rank: int, ranks: int, rank_slots: list[list[int]]) -> list[Action]:
    down, up = rank, 2 * ranks - 1 - rank
    what = ((down, Op.F), (up, Op.F), (up, Op.I), (down, Op.I), (up, Op.W), (down, Op.W))
    timed = sorted(
        (t, kind, k) for kind, slots in enumerate(rank_slots) for k, t in enumerate(slots)
    )
    return [Action(what[kind][0], what[kind][1], k) for _t, kind, k in timed]
