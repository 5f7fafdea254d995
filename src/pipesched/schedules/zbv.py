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
from ..ops import Op


F0, I0, W0, F1, I1, W1 = range(6)  # the six passes of a rank: (kind, chunk)


def rank_order(rank: int, ranks: int, microbatches: int) -> list[Action]:
    """ZB-V program of one rank (see the module docstring for the phases)."""
    p, r = ranks, rank
    n = max(2 * p - 1, microbatches)
    steady_with_forward = n - (2 * p - r - 1)  # chunk-0 forwards left after warm-up and ramp
    passes = (
        [F0] * (2 * (p - r) - 1)  # 1. warm-up
        + [F1, F0] * r  # 2. ramp
        + [F1, I1, W1] * (p - r)  # 3. turn
        + [F0, I0, W0, F1, I1, W1] * steady_with_forward  # 4. steady
        + [I0, W0, F1, I1, W1] * (p - r - 1)
        + [I0, I1] * r  # 5. cool-down
        + [I0, W0] * (p - r)
        + [W1] * r  # 6. drain
        + [W0] * r
    )
    stage = (r, r, r, 2 * p - 1 - r, 2 * p - 1 - r, 2 * p - 1 - r)
    made = [
        [Action(stage[c], kind, k) for k in range(microbatches)]
        for c, kind in enumerate((Op.F, Op.I, Op.W) * 2)
    ]
    count = [0] * 6
    order: list[Action] = []
    for c in passes:
        k = count[c]
        if k < microbatches:  # microbatches beyond m exist only to shape the phases
            order.append(made[c][k])
        count[c] = k + 1
    return order
