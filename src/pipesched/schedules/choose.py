"""Pick the best of several candidate schedules by simulating each under the real costs."""

from __future__ import annotations

from typing import Iterable, Optional

from ..costs import Costs
from ..execution import TOLERANCE, latency
from ..placement import stages_by_rank
from ..schedule import Schedule

OBJECTIVES = ("makespan", "span")


def check_objective(objective: str) -> str:
    """The objective name, or a ConfigError naming the valid ones."""
    from ..errors import ConfigError

    if objective not in OBJECTIVES:
        raise ConfigError(f"objective {objective!r} is not known: use one of {', '.join(OBJECTIVES)}")
    return objective


def objective_value(result, objective: str) -> float:
    """``makespan`` (optimizer steps synchronise ranks) or ``span`` (iterations overlap)."""
    return result.makespan if objective == "makespan" else result.span


def ranked_schedules(
    candidates: Iterable[Optional[Schedule]],
    costs: Costs,
    memory_limit: float,
    objective: str,
) -> list:
    """(key, order, schedule, SimResult) of every candidate within the limit, best first.

    The key is the objective, then the other metric; ``order`` keeps earlier candidates ahead
    on ties, so callers list the schedule they would rather keep first.
    """
    from ..simulate import simulate

    ranked = []
    for order, schedule in enumerate(candidates):
        if schedule is None:
            continue
        result = simulate(schedule, costs)
        if result.max_peak_memory > memory_limit + TOLERANCE:
            continue
        other = result.span if objective == "makespan" else result.makespan
        key = (round(objective_value(result, objective), 9), round(other, 9))
        ranked.append((key, order, schedule, result))
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
    from ..simulate import action_durations

    dur = action_durations(schedule, costs)
    stages = schedule.stages
    head = [0.0] * stages  # earliest start of stage s's first forward
    for s in range(1, stages):
        head[s] = head[s - 1] + dur[(s - 1, "F")] + latency(schedule.placement, s - 1, s, costs.comm)
    best = 0.0
    for r, held in enumerate(stages_by_rank(schedule.placement, schedule.ranks)):
        work = sum(dur[(a.stage, a.kind)] for a in schedule.rank_actions(r))
        start = min(head[s] for s in held) if objective == "makespan" else 0.0
        best = max(best, start + work)
    return best
