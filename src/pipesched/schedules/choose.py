"""Pick the best of several candidate schedules by simulating each under the real costs."""

from __future__ import annotations

from typing import Iterable, Optional

from ..costs import Costs
from ..schedule import Schedule

OBJECTIVES = ("makespan", "span")
_EPS = 1e-9


def check_objective(objective: str) -> str:
    """The objective name, or a ConfigError naming the valid ones."""
    from ..errors import ConfigError

    if objective not in OBJECTIVES:
        raise ConfigError(f"objective {objective!r} is not known: use one of {', '.join(OBJECTIVES)}")
    return objective


def objective_value(result, objective: str) -> float:
    """``makespan`` (optimizer steps synchronise ranks) or ``span`` (iterations overlap)."""
    return result.makespan if objective == "makespan" else result.span


def best_schedule(
    candidates: Iterable[Optional[Schedule]],
    costs: Costs,
    memory_limit: float,
    objective: str,
):
    """The (schedule, SimResult) with the best objective among candidates within the limit.

    Earlier candidates win ties, so callers list the schedule they would rather keep first.
    Returns None when no candidate fits.
    """
    from ..simulate import simulate

    best, best_key = None, None
    for schedule in candidates:
        if schedule is None:
            continue
        result = simulate(schedule, costs)
        if result.max_peak_memory > memory_limit + _EPS:
            continue
        main = objective_value(result, objective)
        other = result.span if objective == "makespan" else result.makespan
        key = (main, other)
        if best_key is None or key[0] < best_key[0] - _EPS or (
            abs(key[0] - best_key[0]) <= _EPS and key[1] < best_key[1] - _EPS
        ):
            best, best_key = (schedule, result), key
    return best
