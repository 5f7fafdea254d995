"""Building-block V schedules at a fraction of 1F1B's memory (Qi et al., NeurIPS 2024).

A building block fixes, for rank ``i``, when (in unit slots, 6 slots per microbatch: two
forwards, two input-gradient backwards, two weight passes) microbatch 0's passes run; microbatch
``j`` repeats it ``6j`` slots later. The activation memory of a rank is set by the lifespans
(forward to weight pass) of its two chunks, and the blocks below keep their sum near ``4p``
slots (V-Min: peak ``(p+4)//3`` microbatches per rank) or ``6p`` slots (V-Half: ``(p+2)//2``). Each W takes the first free slot after its backward. The per-rank programs are the
passes sorted by slot; the simulator then runs them as early as their inputs allow, which is the
paper's "squeeze" (our memory count depends on the order only, so squeezing cannot raise it).
"""

from __future__ import annotations

from functools import lru_cache

from ..actions import Action
from ..ops import Op

PERIOD = 6  # slots per microbatch on one rank: F, f, B, b, W, w


def v_min_offsets(ranks: int, rank: int) -> tuple[int, int, int, int]:
    """Slots of (chunk-0 F, chunk-1 F, chunk-1 I, chunk-0 I) for microbatch 0 in V-Min."""
    p, i = ranks, rank
    gap = 2 if p % 3 == 0 else 0
    return i, 2 * p - 1 - i, 2 * p + gap + i, 4 * p + gap - 1 - i


def v_half_offsets(ranks: int, rank: int) -> tuple[int, int, int, int]:
    """Slots of (chunk-0 F, chunk-1 F, chunk-1 I, chunk-0 I) for microbatch 0 in V-Half."""
    p, i = ranks, rank
    gap = 3 if p % 2 == 0 else 0
    return 2 * i, 3 * p - 2 - i, 3 * p + gap + 2 * i - 1, 6 * p + gap - 2 - i


@lru_cache(maxsize=4)
def block_orders(ranks: int, microbatches: int, offsets) -> tuple[tuple[Action, ...], ...]:
    """Per-rank programs from repeating the block ``offsets(ranks, rank)`` ``microbatches`` times
    (pure, kept for the last few sizes: the V families and zb-auto's seeds ask for the same)."""
    orders = []
    forward, input_backward, weight_backward = Op.F, Op.I, Op.W
    for i in range(ranks):
        down, up = i, 2 * ranks - 1 - i
        f0, f1, b1, b0 = offsets(ranks, i)
        timed: list[tuple[int, int, Action]] = []
        busy: set[int] = set()
        for j in range(microbatches):
            base = PERIOD * j
            for slot, action in (
                (f0, Action(down, forward, j)), (f1, Action(up, forward, j)),
                (b1, Action(up, input_backward, j)), (b0, Action(down, input_backward, j)),
            ):
                timed.append((base + slot, len(timed), action))
                busy.add(base + slot)
        for j in range(microbatches):
            for slot, stage in ((b1, up), (b0, down)):
                w_slot = PERIOD * j + slot + 1
                while w_slot in busy:
                    w_slot += 1
                busy.add(w_slot)
                timed.append((w_slot, len(timed), Action(stage, weight_backward, j)))
        timed.sort()
        orders.append(tuple(a for _, _, a in timed))
    return tuple(orders)
