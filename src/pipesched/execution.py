"""The execution model every check shares: ranks run their actions in order, sends never block.

An action starts when its rank has finished the previous action and its input has arrived:
``F(s,k)`` needs ``F(s-1,k)``; ``I``/``B(s,k)`` needs the backward of ``(s+1,k)``, or ``F(s,k)``
on the last stage; ``W(s,k)`` needs ``I(s,k)``. An input from another rank arrives ``comm``
after it was produced. Computing start times is a longest path over this graph; when no rank
can move, the schedule deadlocks and the error names each stuck rank and what it waits for.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, NamedTuple, Sequence

from .actions import Action
from .errors import DeadlockError


class Span(NamedTuple):
    """One executed action: what ran, and when."""

    action: Action
    start: float
    end: float


def _grad(kind: str) -> str:
    return "G" if kind in "IB" else kind


def dependency(action: Action, stages: int) -> tuple[int, str, int] | None:
    """The (stage, "F"|"G"|"W", microbatch) an action waits for, or None (first stage's F).

    "G" stands for the gradient pass of a stage, whichever of I or B the schedule uses there.
    """
    s, kind, k = action
    if kind == "F":
        return (s - 1, "F", k) if s > 0 else None
    if kind == "W":
        return (s, "G", k)
    return (s + 1, "G", k) if s < stages - 1 else (s, "F", k)


def execute(
    orders: Sequence[Sequence[Action]],
    placement: Sequence[int],
    duration: Callable[[Action], float],
    comm: float,
) -> list[list[Span]]:
    """Run the per-rank programs under the execution model; return each rank's spans.

    Raises DeadlockError naming, for every rank that cannot finish, the action it is stuck on
    and the action that action waits for.
    """
    ranks = len(orders)
    stages = len(placement)
    done: dict[tuple[int, str, int], float] = {}
    waiting: dict[tuple[int, str, int], list[int]] = {}
    pos = [0] * ranks
    free = [0.0] * ranks
    spans: list[list[Span]] = [[] for _ in range(ranks)]
    runnable = deque(range(ranks))
    while runnable:
        r = runnable.popleft()
        order = orders[r]
        i = pos[r]
        t_free = free[r]
        out = spans[r]
        while i < len(order):
            action = order[i]
            s, kind, k = action
            dep = dependency(action, stages)
            start = t_free
            if dep is not None:
                t_dep = done.get(dep)
                if t_dep is None:
                    waiting.setdefault(dep, []).append(r)
                    break
                if placement[dep[0]] != r:
                    t_dep += comm
                if t_dep > start:
                    start = t_dep
            t_free = start + duration(action)
            out.append(Span(action, start, t_free))
            key = (s, _grad(kind), k)
            done[key] = t_free
            woken = waiting.pop(key, None)
            if woken:
                runnable.extend(woken)
            i += 1
        pos[r] = i
        free[r] = t_free
    stuck = [r for r in range(ranks) if pos[r] < len(orders[r])]
    if stuck:
        raise DeadlockError(_deadlock_message(orders, placement, pos, stuck, done))
    return spans


def _deadlock_message(orders, placement, pos, stuck, done) -> str:
    stages = len(placement)
    parts = []
    for r in stuck:
        action = orders[r][pos[r]]
        dep = dependency(action, stages)
        assert dep is not None and dep not in done
        s, g, k = dep
        wanted = f"{s}{'I/B' if g == 'G' else g}{k}"
        owner = placement[s] if 0 <= s < stages else None
        parts.append(f"rank {r} waits at {action} for {wanted} (rank {owner})")
    return "schedule deadlocks: " + "; ".join(parts)
