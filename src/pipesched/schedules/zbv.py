"""ZB-V: zero bubble at 1F1B's memory, with two chunks per rank in a V (Qi et al., 2024).

Rank ``r`` holds stage ``r`` (chunk 0, on the way down) and stage ``2p-1-r`` (chunk 1, on the
way back up), so the loss and the first layer share rank 0 and every rank carries the same
activation load. The program of rank ``r``, in named phases:

1. warm-up: ``2(p-r)-1`` chunk-0 forwards;
2. ramp: ``r`` pairs of (chunk-1 forward, chunk-0 forward);
3. turn: ``p-r`` triples of chunk-1 forward, I, W;
4. steady: chunk-0 F, I, W then chunk-1 F, I, W, until every forward is done;
5. cool-down: ``r`` pairs of (chunk-0 I, chunk-1 I), then chunk-0 I and W in turn;
6. drain: the remaining Ws.

The phases need ``m >= 2p-1`` microbatches; for fewer, the program is built for ``2p-1`` and the
missing microbatches are dropped, which keeps it deadlock-free. With ``F = B = W`` the span per
rank is exactly ``3m`` once ``m >= 2p``, and peak memory is ``p`` (the same as 1F1B).
The ``zb-v`` family (:mod:`.v_family`) uses this program where it fits the memory limit and is
fastest under the given costs.
"""

from __future__ import annotations

from ..actions import Action


def rank_order(rank: int, ranks: int, microbatches: int) -> list[Action]:
    """ZB-V program of one rank (see the module docstring for the phases)."""
    p, r = ranks, rank
    n = max(2 * p - 1, microbatches)
    down, up = r, 2 * p - 1 - r
    count = {"F0": 0, "F1": 0, "I0": 0, "I1": 0, "W0": 0, "W1": 0}
    order: list[Action] = []

    def put(kind: str, chunk: int) -> None:
        slot = f"{kind}{chunk}"
        order.append(Action(down if chunk == 0 else up, kind, count[slot]))
        count[slot] += 1

    for _ in range(2 * (p - r) - 1):  # 1. warm-up
        put("F", 0)
    for _ in range(r):  # 2. ramp
        put("F", 1)
        put("F", 0)
    for _ in range(p - r):  # 3. turn
        put("F", 1)
        put("I", 1)
        put("W", 1)
    while count["F1"] < count["F0"] or count["F0"] < n:  # 4. steady
        if count["F0"] < n:
            put("F", 0)
        put("I", 0)
        put("W", 0)
        put("F", 1)
        put("I", 1)
        put("W", 1)
    for _ in range(r):  # 5. cool-down
        put("I", 0)
        put("I", 1)
    for _ in range(p - r):
        put("I", 0)
        put("W", 0)
    while count["W1"] < count["I1"]:  # 6. drain
        put("W", 1)
    while count["W0"] < count["I0"]:
        put("W", 0)
    return [a for a in order if a.microbatch < microbatches]
