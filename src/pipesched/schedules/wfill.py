"""Place the weight-gradient passes (W) of a split-backward schedule where they cost nothing.

Input: each rank's forwards and input-gradient backwards in a fixed order. The ranks are
executed under the cost model; whenever a rank would wait for an input, it runs pending ``W``s
that fit entirely in the wait (oldest first), and before a forward that would exceed the memory
limit it runs ``W``s to free activations. Leftover ``W``s drain at the end. Because the program
comes out of an execution, it is free of deadlock whenever the input order is.
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

from ..actions import Action
from ..costs import Costs, durations_for
from ..errors import DeadlockError
from ..dependencies import Output, dependency, produced
from ..execution import TOLERANCE, latency
from ..memory import UNIT_CHANGE
from ..ops import Op
from ..placement import stages_by_rank
from ..schedule import Schedule


def fill_weight_passes(
    skeleton: Sequence[Sequence[Action]],
    placement: tuple[int, ...],
    microbatches: int,
    costs: Costs,
    memory_limit: float,
    name: str,
    fill_partial_waits: bool = False,
) -> Schedule:
    """Insert every ``W`` into the F/I programs in ``skeleton``; return the full schedule.

    With ``fill_partial_waits`` a pending ``W`` also starts in a wait shorter than itself (the
    next action starts a little late, but fewer ``W``s pile up at the end).
    """
    ranks = len(skeleton)
    stages = len(placement)
    table = durations_for(placement, ranks, costs)
    held_cap = [memory_limit * max(1, len(s)) for s in stages_by_rank(placement, ranks)]
    done: dict[tuple[int, Output, int], float] = {}  # by what each placed action made
    waiting: dict[tuple[int, Output, int], list[int]] = {}
    pos = [0] * ranks
    clock = [0.0] * ranks
    held = [0] * ranks
    pending: list[deque] = [deque() for _ in range(ranks)]
    out: list[list[Action]] = [[] for _ in range(ranks)]

    def run(r: int, action: Action, start: float) -> None:
        end = start + table[(action.stage, action.kind)]
        clock[r] = end
        out[r].append(action)
        s, kind, k = action
        held[r] += UNIT_CHANGE[kind]
        if kind is Op.I:
            pending[r].append(Action(s, Op.W, k))
        key = produced(action)
        done[key] = end
        for woken in waiting.pop(key, ()):
            runnable.append(woken)

    runnable = deque(range(ranks))
    while runnable:
        r = runnable.popleft()
        program = skeleton[r]
        while pos[r] < len(program):
            action = program[pos[r]]
            if action.kind is Op.F:
                while held[r] + 1 > held_cap[r] + TOLERANCE and pending[r]:
                    run(r, pending[r].popleft(), clock[r])
            dep = dependency(action, stages)
            arrival = clock[r]
            if dep is not None:
                t_dep = done.get(dep)
                if t_dep is None:
                    waiting.setdefault(dep, []).append(r)
                    break
                arrival = t_dep + latency(placement, dep[0], action.stage, costs.comm)
            while pending[r] and clock[r] < arrival - TOLERANCE:
                w = pending[r][0]
                if clock[r] + table[(w.stage, Op.W)] > arrival + TOLERANCE and not fill_partial_waits:
                    break
                run(r, pending[r].popleft(), clock[r])
            run(r, action, max(clock[r], arrival))
            pos[r] += 1
        else:
            while pending[r]:
                run(r, pending[r].popleft(), clock[r])
    if any(pos[r] < len(skeleton[r]) for r in range(ranks)):
        raise DeadlockError(f"{name}: the forward/backward order deadlocks before W placement")
    return Schedule(ranks, microbatches, placement, tuple(tuple(o) for o in out), name=name)
