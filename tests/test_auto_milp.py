"""The exact refinement: never worse than the greedy result, bounds that hold, within its time."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cost_strategies
from pipesched import Costs, Schedule, simulate, validate
from pipesched.auto import build_auto
from pipesched.auto.milp import refine
from pipesched.schedules.choose import objective_value, work_bound

costs_strategy = cost_strategies.costs(0.3, 2.0, 0.3)


@settings(max_examples=8, deadline=None)
@given(
    p=st.integers(2, 3), m=st.integers(2, 4), costs=costs_strategy,
    limit=st.integers(1, 4), objective=st.sampled_from(["makespan", "span"]),
)
def test_milp_is_never_worse_than_the_greedy(p, m, costs, limit, objective):
    greedy = build_auto(p, m, costs, memory_limit=limit, objective=objective, milp=False)
    refined = build_auto(p, m, costs, memory_limit=limit, objective=objective, time_limit=1.0)
    validate(refined)
    before = objective_value(simulate(greedy, costs), objective)
    after = simulate(refined, costs)
    assert objective_value(after, objective) <= before + 1e-9
    assert after.max_peak_memory <= limit + 1e-9
    found = refined.meta["milp"]
    assert found["lower_bound"] <= objective_value(after, objective) + 1e-6
    assert 0 <= found["gap"] <= 1


def test_refine_returns_a_better_order_or_none_and_a_valid_bound():
    costs = Costs(F=1, B=1.4, W=0.6, comm=0.1)
    # a deliberately poor start: one microbatch at a time through a 2-rank pipeline
    orders = [
        [a for k in range(3) for a in (f"0F{k}", f"0I{k}", f"0W{k}")],
        [a for k in range(3) for a in (f"1F{k}", f"1I{k}", f"1W{k}")],
    ]
    from pipesched import Action

    poor = Schedule.from_orders([[Action.parse(x) for x in row] for row in orders], name="poor")
    before = simulate(poor, costs).makespan
    found = refine(poor, costs, memory_limit=2, objective="makespan", time_limit=5)
    assert found.schedule is not None
    validate(found.schedule)
    after = simulate(found.schedule, costs)
    assert after.makespan < before
    assert after.max_peak_memory <= 2
    assert work_bound(poor, costs, "makespan") <= found.lower_bound <= after.makespan + 1e-6


def test_milp_stays_within_its_time_limit():
    costs = Costs(F=1, B=1.4, W=0.6, comm=0.1, stage_multipliers=(1.3, 1, 1, 1.3))
    start = time.perf_counter()
    schedule = build_auto(4, 8, costs, time_limit=2.0)
    elapsed = time.perf_counter() - start
    assert schedule.meta["milp"]["seconds"] <= 1.0 + 0.5  # half the budget, plus model building
    assert elapsed < 2.0 + 3.0  # the candidate search itself takes well under a second here


def test_unit_costs_are_proven_optimal_by_the_work_bound():
    schedule = build_auto(4, 8)
    assert schedule.meta["milp"]["status"] == "greedy-optimal"
    assert schedule.meta["milp"]["gap"] == pytest.approx(0)
