"""One ranking rule for every choice among candidates: objective, other time, peak, order."""

from __future__ import annotations

from pipesched import Costs, Schedule, build_schedule, simulate
from pipesched.ranking import rank_key, significant
from pipesched.schedules.choose import best_schedule
from pipesched.schedules.interleaved import pick_fastest


def test_the_objective_decides_then_the_other_time_then_memory():
    assert rank_key(10, 12, 4, "makespan") < rank_key(11, 11, 1, "makespan")
    assert rank_key(10, 11, 4, "makespan") < rank_key(10, 12, 1, "makespan")
    assert rank_key(10, 11, 1, "makespan") < rank_key(10, 11, 4, "makespan")
    assert rank_key(12, 10, 4, "span") < rank_key(11, 11, 1, "span")


def test_float_rounding_never_decides():
    assert significant(0.1 + 0.2) == significant(0.3)
    assert rank_key(3 * 0.1, 1, 1, "makespan") == rank_key(0.3, 1, 1, "makespan")


def _renamed(schedule: Schedule, name: str) -> Schedule:
    return Schedule(schedule.ranks, schedule.microbatches, schedule.placement, schedule.orders, name=name)


def test_choosers_agree_on_ties_leaner_then_earlier():
    # gpipe and 1f1b take the same time at p=2, m=2 under unit costs; 1f1b holds less
    gpipe, one_f = build_schedule("gpipe", 2, 3), build_schedule("1f1b", 2, 3)
    costs = Costs()
    assert simulate(gpipe, costs).makespan == simulate(one_f, costs).makespan
    assert simulate(gpipe, costs).max_peak_memory > simulate(one_f, costs).max_peak_memory
    assert best_schedule([gpipe, one_f], costs, 10, "makespan")[0] is one_f
    assert pick_fastest([gpipe, one_f], costs, 10) is one_f
    twin = _renamed(one_f, "twin")
    assert best_schedule([one_f, twin], costs, 10, "makespan")[0] is one_f
    assert pick_fastest([twin, one_f], costs, 10) is twin
