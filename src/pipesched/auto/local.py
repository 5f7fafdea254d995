"""Local improvement of a finished schedule: swap neighbouring actions on one rank.

The greedy and handcrafted candidates fix some choices by rule (where a W goes, which of two
ready passes runs first). Swapping two neighbouring actions of one rank and re-simulating finds
the cases where the rule was wrong for these costs. A swap is kept only if the schedule stays
free of deadlock, within the memory limit, and strictly better by the objective; passes repeat
until none helps or the evaluation budget is spent (a work bound, so every machine finds the same
schedule; the time budget is only a hard stop).
"""

from __future__ import annotations

import time

from ..costs import Costs
from ..errors import DeadlockError
from ..execution import TOLERANCE
from ..schedule import Schedule
from ..simulate import simulate
from ..ranking import result_key

SWAP_EVALUATIONS = 150  # schedules simulated at most (the work bound that makes results portable)


def improve_by_swaps(
    schedule: Schedule,
    costs: Costs,
    memory_limit: float,
    objective: str,
    seconds: float,
    max_evaluations: int = SWAP_EVALUATIONS,
) -> Schedule:
    """Hill-climb over swaps of neighbouring actions; returns ``schedule`` if nothing helps."""
    deadline = time.perf_counter() + seconds
    budget = [max_evaluations]
    orders = [list(schedule.rank_actions(r)) for r in range(schedule.ranks)]
    best = result_key(simulate(schedule, costs), objective)

    def evaluate() -> tuple[float, float, float] | None:
        budget[0] -= 1
        candidate = Schedule(schedule.ranks, schedule.microbatches, schedule.placement,
                             tuple(tuple(o) for o in orders), name=schedule.name)
        try:
            result = simulate(candidate, costs)
        except DeadlockError:
            return None
        if result.max_peak_memory > memory_limit + TOLERANCE:
            return None
        return result_key(result, objective)

    improved = True
    def spent() -> bool:
        return budget[0] <= 0 or time.perf_counter() >= deadline

    while improved and not spent():
        improved = False
        for order in orders:
            for i in range(len(order) - 1):
                a, b = order[i], order[i + 1]
                if a.stage == b.stage and a.microbatch == b.microbatch:
                    continue  # one depends on the other
                if a.stage == b.stage and a.kind == b.kind:
                    continue  # keep each stage's passes of one kind in microbatch order
                order[i], order[i + 1] = b, a
                score = evaluate()
                if score is not None and score < best:
                    best, improved = score, True
                else:
                    order[i], order[i + 1] = a, b
                if spent():
                    break
    return Schedule(schedule.ranks, schedule.microbatches, schedule.placement,
                    tuple(tuple(o) for o in orders), name=schedule.name, meta=schedule.meta)

