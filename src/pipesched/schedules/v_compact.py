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

import bisect
from functools import lru_cache
from typing import Optional, Sequence

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


def _inputs_slot(table: Timetable, rank: int, kind: int, k: int, ranks: int, merged: Sequence[int] = ()) -> int:
    """The latest slot among what pass ``kind`` of microbatch ``k`` on ``rank`` waits for
    (``merged``: the rank's backward slots in time order, where one W queue serves both chunks)."""
    mine = table[rank]
    latest = -1
    if kind in (F0, I1) and rank > 0:
        latest = table[rank - 1][kind][k]
    if kind in (F1, I0) and rank < ranks - 1:
        latest = max(latest, table[rank + 1][kind][k])
    if kind in (F1, I1, I0):
        latest = max(latest, mine[kind - 1][k])  # the pass before it in the V, on this rank
    if kind >= W1:
        backward = merged if len(mine) == 5 else mine[I1 if kind == W1 else I0]
        latest = max(latest, backward[k])
    if k > 0:
        latest = max(latest, mine[kind][k - 1])
    return latest


def _compact(table: Timetable, ranks: int, microbatches: int, weights_explicit: bool) -> Timetable:
    """Move warm-up (if ``weights_explicit``) and cool-down passes earlier, keeping each peak."""
    table = [[list(s) for s in rank_slots] for rank_slots in table]
    length = max(t for rank_slots in table for s in rank_slots for t in s) + 2
    if weights_explicit:
        profiles = [_memory_profile(rank_slots, length) for rank_slots in table]
        merged = [sorted(rank_slots[I1] + rank_slots[I0]) for rank_slots in table]
    else:
        implicit = [_ImplicitWeights(rank_slots, length) for rank_slots in table]
        profiles = [p.level for p in implicit]
        merged = [()] * ranks
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
        earliest = _inputs_slot(table, rank, kind, k, ranks, merged[rank]) + 1
        for slot in range(earliest, t):
            if slot in occupied[rank]:
                continue
            moved = (_moved_explicit(table[rank], profiles[rank], merged[rank], kind, k, slot, peak)
                     if weights_explicit else implicit[rank].moved(kind, t, slot, peak))
            if moved:
                table[rank][kind][k] = slot
                break
        occupied[rank].add(table[rank][kind][k])
    return table


def _moved_explicit(rank_slots, profile: list[int], merged: list[int], kind: int, k: int, slot: int, peak: int) -> bool:
    """Whether the pass (explicit W slots) may move to ``slot`` within ``peak``; if so, update
    ``profile`` and ``merged`` (the caller moves it)."""
    old = rank_slots[kind][k]
    if kind in _FORWARDS:  # an earlier F holds one more activation from slot to old
        if max(profile[slot:old]) + 1 > peak:
            return False
        for t in range(slot, old):
            profile[t] += 1
    elif kind >= W1:  # an earlier W frees memory earlier: the peak cannot rise
        for t in range(slot, old):
            profile[t] -= 1
    else:  # a backward frees nothing: only where the W queue looks changes
        merged.pop(bisect.bisect_left(merged, old))
        bisect.insort(merged, slot)
    return True


class _ImplicitWeights:
    """One rank's activations after each slot when its Ws are implicit (a pending W runs at
    every free slot, as :func:`_memory_profile` counts), kept up to date as passes move.

    The level and the pending Ws after slot ``t`` depend only on those after ``t - 1`` and on
    what occupies ``t``; a move from ``old`` to an earlier ``slot`` changes what occupies
    those two slots only, so the profile is recomputed from ``slot`` until, past ``old``, it
    meets the state it had (from there on it is the same as before)."""

    def __init__(self, rank_slots: list[list[int]], length: int) -> None:
        self.forward = {t for kind in _FORWARDS for t in rank_slots[kind]}
        self.backward = {t for kind in _BACKWARDS for t in rank_slots[kind]}
        self.length = length
        self.level: list[int] = []
        self.pending: list[int] = []
        self._run(0, 0, 0, None, None)

    def _run(self, start: int, level: int, pending: int, old: Optional[int], peak: Optional[int]) -> Optional[int]:
        """Recompute from ``start``; stop past ``old`` where the state meets the kept one, or
        (returning None, nothing changed) where the level exceeds ``peak``. Returns the end."""
        forward, backward, levels, pendings = self.forward, self.backward, [], []
        t = start
        while t < self.length:
            if t in backward:
                pending += 1
            elif t in forward:
                level += FORWARD_TAKES
            elif pending:
                pending -= 1
                level += WEIGHT_PASS_FREES
            if peak is not None and level > peak:
                return None
            if old is not None and t >= old and level == self.level[t] and pending == self.pending[t]:
                break
            levels.append(level)
            pendings.append(pending)
            t += 1
        self.level[start:t] = levels
        self.pending[start:t] = pendings
        return t

    def moved(self, kind: int, old: int, slot: int, peak: int) -> bool:
        """Move the pass of ``kind`` at ``old`` to the free ``slot`` if the level stays within
        ``peak`` everywhere (else leave it)."""
        kept = self.forward if kind in _FORWARDS else self.backward
        kept.discard(old)
        kept.add(slot)
        before = (self.level[slot - 1], self.pending[slot - 1]) if slot > 0 else (0, 0)
        if self._run(slot, *before, old, peak) is None:
            kept.discard(slot)
            kept.add(old)
            return False
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
    # per rank, the backwards squeezed so far: their starts rise in this order (each start is at
    # least the rank's free slot), so they are sorted; the merged W queue reads the backwards
    # not squeezed yet as slot 0, as the table being filled holds them
    backward_starts: list[list[int]] = [[] for _ in range(ranks)]
    backward_count = [len(rank_slots[I1]) + len(rank_slots[I0]) for rank_slots in table]
    for _t, rank, kind, k in order:
        done = backward_starts[rank]
        merged = _Padded(done, backward_count[rank] - len(done)) if kind >= W1 else ()
        start = max(free[rank], _inputs_slot(squeezed, rank, kind, k, ranks, merged) + 1)
        squeezed[rank][kind][k] = start
        free[rank] = start + 1
        if kind in _BACKWARDS:
            done.append(start)
    return squeezed


class _Padded(Sequence):
    """``[0] * pad + starts``, not copied: a W reads one entry (a copy per W was O(m^2) a rank)."""

    def __init__(self, starts: list[int], pad: int) -> None:
        self.starts, self.pad = starts, pad

    def __len__(self) -> int:
        return self.pad + len(self.starts)

    def __getitem__(self, k: int) -> int:
        return 0 if k < self.pad else self.starts[k - self.pad]


def _programs(rank: int, ranks: int, rank_slots: list[list[int]]) -> list[Action]:
    down, up = rank, 2 * ranks - 1 - rank
    what = ((down, Op.F), (up, Op.F), (up, Op.I), (down, Op.I), (up, Op.W), (down, Op.W))
    timed = sorted(
        (t, kind, k) for kind, slots in enumerate(rank_slots) for k, t in enumerate(slots)
    )
    return [Action(what[kind][0], what[kind][1], k) for _t, kind, k in timed]
