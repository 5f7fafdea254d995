"""DualPipeV: DeepSeek's DualPipe cut in half, on a V, with overlapped forward and backward.

Rank ``r`` holds stage ``r`` (chunk 0) and stage ``2p-1-r`` (chunk 1), as in ZB-V. In the
steady state every slot is an overlapped pair (:class:`~pipesched.actions.Overlap`): the
forward of one chunk runs together with the full backward of the other, so that one half's
communication (MoE all-to-all, in DeepSeek-V3) hides under the other's compute. The program of
rank ``r``, in DualPipe's eight phases (``n = max(m, 2p)`` microbatches shape them):

1. ``2(p-r-1)`` chunk-0 forwards;
2. ``r+1`` pairs of (chunk-0 forward, chunk-1 forward);
3. ``p-r-1`` triples of chunk-1 input-gradient backward, the oldest pending W, chunk-1 forward;
4. ``n-2p+r+1`` times: (chunk-0 F & chunk-1 B), (chunk-1 F & chunk-0 B); the last rank runs its
   very first pair one after the other, which shortens the bubble;
5. ``p-r-1`` times: chunk-1 B, then (chunk-1 F & chunk-0 B);
6. ``r+1`` pairs of (chunk-1, chunk-0) backwards, the second half of them split (I, W later);
7. ``p-r-1`` times: the oldest pending W, then a chunk-0 backward;
8. the ``r+1`` pending Ws.

This is the order torch's ``ScheduleDualPipeV`` writes (the tests compare them action by
action). For ``m < 2p`` the program is shaped for ``2p`` microbatches and the missing ones are
dropped (an overlapped pair that loses a half runs the other alone), which keeps it free of
deadlock; torch refuses those cases. Peak memory is ``p + 1/2`` microbatches' activations.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from ..actions import Action, Overlap, Slot, sub_actions
from ..ops import Op
from ..placement import v_placement
from ..schedule import Schedule


class _RankProgram:
    """One rank's program being written: per (stage, kind) counters and the pending Ws."""

    def __init__(self) -> None:
        self.entries: list[Slot] = []
        self.forwards: dict[int, int] = {}
        self.backwards: dict[int, int] = {}
        self.pending_weights: deque[Action] = deque()

    def forward(self, stage: int) -> Action:
        k = self.forwards.get(stage, 0)
        self.forwards[stage] = k + 1
        return Action(stage, Op.F, k)

    def backward(self, stage: int, split: bool = False) -> Action:
        k = self.backwards.get(stage, 0)
        self.backwards[stage] = k + 1
        if split:
            self.pending_weights.append(Action(stage, Op.W, k))
        return Action(stage, Op.I if split else Op.B, k)

    def add(self, *actions: Action) -> None:
        self.entries.extend(actions)

    def overlap(self, forward_stage: int, backward_stage: int) -> None:
        self.entries.append(Overlap(self.forward(forward_stage), self.backward(backward_stage)))

    def oldest_weight(self) -> None:
        if self.pending_weights:
            self.entries.append(self.pending_weights.popleft())


def rank_program(rank: int, ranks: int, microbatches: int) -> list[Slot]:
    """DualPipeV program of one rank (see the module docstring for the phases)."""
    p, r = ranks, rank
    n = max(microbatches, 2 * p)
    down, up = r, 2 * p - 1 - r
    prog = _RankProgram()
    for _ in range(2 * (p - r - 1)):  # 1
        prog.add(prog.forward(down))
    for _ in range(r + 1):  # 2
        prog.add(prog.forward(down), prog.forward(up))
    for _ in range(p - r - 1):  # 3
        prog.add(prog.backward(up, split=True))
        prog.oldest_weight()
        prog.add(prog.forward(up))
    for i in range(n - 2 * p + r + 1):  # 4
        if i == 0 and r == p - 1:
            prog.add(prog.forward(down), prog.backward(up))
        else:
            prog.overlap(down, up)
        prog.overlap(up, down)
    for _ in range(p - r - 1):  # 5
        prog.add(prog.backward(up))
        prog.overlap(up, down)
    split = False
    for i in range(r + 1):  # 6
        split = split or (i == (r + 1) // 2 and r % 2 == 1)
        prog.add(prog.backward(up, split))
        split = split or (i == (r + 1) // 2 and r % 2 == 0)
        prog.add(prog.backward(down, split))
    for _ in range(p - r - 1):  # 7
        prog.oldest_weight()
        prog.add(prog.backward(down, split))
    for _ in range(r + 1):  # 8
        prog.oldest_weight()
    return trimmed(prog.entries, lambda a: a.microbatch < microbatches)


def trimmed(entries: list[Slot], keep: Callable[[Action], bool]) -> list[Slot]:
    """The entries without the actions ``keep`` rejects (an overlapped pair that loses a half
    runs the other alone; one that loses both disappears)."""
    out: list[Slot] = []
    for entry in entries:
        kept = [a for a in sub_actions(entry) if keep(a)]
        if len(kept) == 2:
            out.append(entry)
        elif kept:
            out.append(kept[0])
    return out


def build(ranks: int, microbatches: int) -> Schedule:
    """DualPipeV on ``ranks`` ranks (2 stages each, V placement); costs do not change the order."""
    orders = tuple(tuple(rank_program(r, ranks, microbatches)) for r in range(ranks))
    return Schedule(ranks, microbatches, v_placement(ranks), orders, name="dualpipev")
