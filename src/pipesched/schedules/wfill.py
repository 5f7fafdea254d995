"""Place the weight-gradient passes (W) of a split-backward schedule where they cost nothing.

Input: each rank's forwards and input-gradient backwards in a fixed order. The ranks are
executed under the cost model; whenever a rank would wait for an input, it runs pending ``W``s
that fit entirely in the wait (oldest first), and before a forward that would exceed the memory
limit it runs ``W``s to free activations. Leftover ``W``s drain at the end. Because the program
comes out of an execution, it is free of deadlock whenever the input order is.

zb-auto re-places the W passes of its best candidates and interleaved-zb of each of its
skeletons, hundreds of thousands of actions each at large sizes: the execution therefore reads
per-stage tables made once (:func:`_pass_table`: duration, memory change, what a pass waits for
and its delay) and names each pass's output by an integer, not by asking the dependency rule and
hashing an ``Op`` per action; the times are the same sums in the same order, so the schedule is too.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Optional, Sequence

from ..actions import Action
from ..costs import Costs, durations_for
from ..errors import DeadlockError
from ..dependencies import OUTPUT, Output, dependencies
from ..execution import TOLERANCE, latency
from ..memory import UNIT_CHANGE
from ..ops import Op
from ..placement import stages_by_rank
from ..schedule import Schedule

_SLOT = {Output.ACTIVATION: 0, Output.INPUT_GRAD: 1, Output.WEIGHT_GRAD: 2}  # an output's key: slot + 3 * stage + stride * microbatch
_KINDS = (Op.F, Op.I, Op.W, Op.B)


def fill_weight_passes(
    skeleton: Sequence[Sequence[Action]],
    placement: tuple[int, ...],
    microbatches: int,
    costs: Costs,
    memory_limit: float,
    name: str,
    fill_partial_waits: bool = False,
    give_up_after: float = math.inf,
) -> Optional[Schedule]:
    """Insert every ``W`` into the F/I programs in ``skeleton``; return the full schedule.

    With ``fill_partial_waits`` a pending ``W`` also starts in a wait shorter than itself (the
    next action starts a little late, but fewer ``W``s pile up at the end). None when an action
    would end after ``give_up_after`` (the schedule's makespan is then above it: the execution is
    the simulator's, :func:`pipesched.execution.run`, with the same sums in the same order).
    """
    ranks = len(skeleton)
    stride = 3 * len(placement)
    table = _pass_table(placement, ranks, costs)
    programs = [[_step(a, table, stride) for a in program] for program in skeleton]
    held_cap = [memory_limit * max(1, len(s)) + TOLERANCE for s in stages_by_rank(placement, ranks)]
    done: dict[int, float] = {}  # by the key of what each placed action made
    waiting: dict[int, list[int]] = {}
    pos = [0] * ranks
    clock = [0.0] * ranks
    held = [0] * ranks
    pending: list[deque] = [deque() for _ in range(ranks)]
    out: list[list[Action]] = [[] for _ in range(ranks)]
    runnable = deque(range(ranks))

    def run(r: int, step: tuple, start: float) -> None:
        action, _, duration, change, _, _, made, weight = step
        clock[r] = start + duration
        if clock[r] > give_up_after:
            raise _GaveUp
        out[r].append(action)
        held[r] += change
        if weight is not None:
            pending[r].append(weight)
        if made >= 0:
            done[made] = clock[r]
            for woken in waiting.pop(made, ()):
                runnable.append(woken)

    try:
        while runnable:
            r = runnable.popleft()
            program, queue = programs[r], pending[r]
            while pos[r] < len(program):
                step = program[pos[r]]
                if step[1]:  # a forward: free activations first if it would exceed the limit
                    while held[r] + 1 > held_cap[r] and queue:
                        run(r, queue.popleft(), clock[r])
                arrival = clock[r]
                if step[4] >= 0:
                    t_dep = done.get(step[4])
                    if t_dep is None:
                        waiting.setdefault(step[4], []).append(r)
                        break
                    arrival = t_dep + step[5]
                while queue and clock[r] < arrival - TOLERANCE:
                    if clock[r] + queue[0][2] > arrival + TOLERANCE and not fill_partial_waits:
                        break
                    run(r, queue.popleft(), clock[r])
                run(r, step, max(clock[r], arrival))
                pos[r] += 1
            else:
                while queue:
                    run(r, queue.popleft(), clock[r])
    except _GaveUp:
        return None
    if any(pos[r] < len(skeleton[r]) for r in range(ranks)):
        raise DeadlockError(f"{name}: the forward/backward order deadlocks before W placement")
    return Schedule(ranks, microbatches, placement, tuple(tuple(o) for o in out), name=name)


def _pass_table(placement: tuple[int, ...], ranks: int, costs: Costs) -> dict:
    """Per kind, per stage: (duration, change of the rank's held activations, key base of the
    output it waits for or -1, that output's delay, key base of its own output or -1 when
    nothing waits for it)."""
    stages = len(placement)
    durations = durations_for(placement, ranks, costs)
    needs = dependencies(stages).needs
    awaited = {need[1] for per_kind in needs.values() for need in per_kind if need is not None}
    table = {}
    for kind in _KINDS:
        rows = []
        for s in range(stages):
            need = needs[kind][s]
            wait, delay = (-1, 0.0) if need is None else (
                _SLOT[need[1]] + 3 * need[0], latency(placement, need[0], s, costs.comm))
            made = _SLOT[OUTPUT[kind]] + 3 * s if OUTPUT[kind] in awaited else -1
            rows.append((durations[(s, kind)], UNIT_CHANGE[kind], wait, delay, made))
        table[kind] = rows
    return table


def _step(action: Action, table: dict, stride: int) -> tuple:
    """One action as the execution reads it: (action, is a forward, duration, memory change, key
    it waits for or -1, delay, key it makes or -1, its W's step when it is an ``I``)."""
    s, kind, k = action
    duration, change, wait, delay, made = table[kind][s]
    offset = stride * k
    later: Optional[tuple] = None
    if kind is Op.I:
        later = _step(Action(s, Op.W, k), table, stride)
    return (action, kind is Op.F, duration, change, wait + offset if wait >= 0 else -1, delay,
            made + offset if made >= 0 else -1, later)


class _GaveUp(Exception):
    """An action of the execution ended after ``give_up_after``."""
