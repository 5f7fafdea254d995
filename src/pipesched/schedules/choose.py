"""Pick the best of several candidate schedules by simulating each under the real costs.

The ranking rule itself is :func:`pipesched.ranking.rank_key` (objective, other time, peak
memory; earlier candidates win what is still tied).
"""

from __future__ import annotations

from typing import Iterable, Optional

from ..costs import Costs
from ..execution import TOLERANCE, latency
from ..ops import Op
from ..placement import stages_by_rank
from ..ranking import OBJECTIVES, check_objective, objective_value, result_key
from ..schedule import Schedule
from ..simulate import action_durations, simulate

__all__ = ["OBJECTIVES", "best_schedule", "check_objective", "objective_value", "ranked_schedules", "work_bound"]

def ranked_schedules(
    candidates: Iterable[Optional[Schedule]],
    costs: Costs,
    memory_limit: float,
    objective: str,
) -> list:
    """(key, order, schedule, SimResult) of every candidate within the limit, best first.

    The key is :func:`~pipesched.ranking.result_key`; ``order`` keeps earlier candidates ahead
    on ties, so callers list the schedule they would rather keep first.
    """
    ranked = []
    for order, schedule in enumerate(candidates):
        if schedule is None:
            continue
        result = simulate(schedule, costs)
        if result.max_peak_memory > memory_limit + TOLERANCE:
            continue
        ranked.append((result_key(result, objective), order, schedule, result))
    ranked.sort(key=lambda item: (item[0], item[1]))
    return ranked


def best_schedule(
    candidates: Iterable[Optional[Schedule]],
    costs: Costs,
    memory_limit: float,
    objective: str,
):
    """The (schedule, SimResult) with the best objective among candidates within the limit,
    or None when no candidate fits (earlier candidates win ties)."""
    ranked = ranked_schedules(candidates, costs, memory_limit, objective)
    return (ranked[0][2], ranked[0][3]) if ranked else None


def work_bound(schedule: Schedule, costs: Costs, objective: str) -> float:
    """A lower bound on the objective for any order: each rank's work after its earliest start."""
    dur = action_durations(schedule, costs)
    stages = schedule.stages
    head = [0.0] * stages  # earliest start of stage s's first forward
    for s in range(1, stages):
        head[s] = head[s - 1] + dur[(s - 1, Op.F)] + latency(schedule.placement, s - 1, s, costs.comm)
    best = 0.0
    for r, held in enumerate(stages_by_rank(schedule.placement, schedule.ranks)):
        work = sum(dur[(a.stage, a.kind)] for a in schedule.rank_actions(r))
        start = min(head[s] for s in held) if objective == "makespan" else 0.0
        best = max(best, start + work)
    return best
