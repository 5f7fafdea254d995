"""The bubble share of a logging interval (runtime/metering/bubble_share.py): measured from the
action spans, simulated by ``simulate()`` for the same schedule under costs taken from the same
spans. The simulator's own timeline, read back as if measured, gives back its own figure; a
timeline with time between its actions (what a runtime adds) measures a larger bubble than the
simulator gives its actions' durations."""

from __future__ import annotations

import pytest

from pipesched import Costs, build_schedule, simulate
from pipesched.execution import Span
from pipesched.runtime.metering.bubble_share import bubble_figures, idle_shares, interval_costs, simulated_bubble


def as_measured(result, seconds_per_unit: float = 1e-3) -> list:
    """The simulator's timeline of ``result`` as a measured step (seconds)."""
    return [[Span(s.action, s.start * seconds_per_unit, s.end * seconds_per_unit) for s in rank] for rank in result.timeline]


@pytest.mark.parametrize("name,chunks", [("1f1b", None), ("zb-v", None), ("interleaved-1f1b", 2)])
def test_the_simulators_own_timeline_measures_its_own_bubble_and_simulates_back_to_it(name, chunks):
    schedule = build_schedule(name, ranks=2, microbatches=4, chunks=chunks) if chunks else build_schedule(name, 2, 4)
    costs = Costs(F=1.0, B=1.3, W=0.7, comm=0.05, stage_multipliers=(1.2, 0.8))
    want = simulate(schedule, costs)
    step = as_measured(want)
    figures = bubble_figures(schedule, [step, step], comm=0.05e-3)
    assert figures["bubble_share"] == pytest.approx(want.bubble_ratio, abs=1e-12)
    per_rank = [1 - busy / want.makespan for busy in want.busy]
    assert figures["bubble_share_per_rank"] == pytest.approx(per_rank, abs=1e-12)
    # the per-stage kinds here are one cost each times a stage factor: the costs come back exactly
    # (up to float rounding), and so does the simulated figure
    assert figures["simulated_bubble_share"] == pytest.approx(want.bubble_ratio, abs=1e-9)
    got = Costs(**{k: v for k, v in figures["simulated_costs_ms"].items()})
    assert figures["simulated_bubble_share"] == simulate(schedule, got).bubble_ratio  # simulate()'s figure, exactly


def test_time_between_actions_is_measured_and_not_simulated():
    schedule = build_schedule("zb-v", 2, 4)
    step = as_measured(simulate(schedule, Costs(F=1.0, B=1.0, W=1.0)))
    late = [[Span(s.action, s.start + 2e-4 * i, s.end + 2e-4 * i) for i, s in enumerate(rank)] for rank in step]  # gaps
    figures = bubble_figures(schedule, [late], comm=0.0)
    costs = interval_costs(schedule, [late], 0.0)
    assert (costs.F, costs.B, costs.W) == pytest.approx((1.0, 1.0, 1.0))  # a rank's share: its 2 stages of 0.5 ms
    assert figures["simulated_bubble_share"] == simulated_bubble(schedule, costs) == simulate(schedule, costs).bubble_ratio
    assert figures["bubble_share"] == pytest.approx(sum(idle_shares([late])) / 2, abs=1e-15)
    assert 0 <= figures["simulated_bubble_share"] < figures["bubble_share"] <= 1


def test_a_recomputed_backward_timed_below_its_forward_still_simulates():
    """A recomputed stage's ``I`` less the forward it reran is what the simulator takes; on a busy
    host ``F`` can take longer than that ``I`` (seen under auto's interleaved-zb, recomputing
    every stage): the backward counts as nothing, held at the costs' floor, not a negative cost."""
    from pipesched.costs import COST_RANGE

    schedule = build_schedule("zb-v", 2, 4)
    step = as_measured(simulate(schedule, Costs(F=2.0, B=1.0, W=1.0)))
    every = frozenset(range(schedule.stages))
    assert interval_costs(schedule, [step], 0.0, every).B == COST_RANGE[0]
    assert 0 <= bubble_figures(schedule, [step], 0.0, every)["simulated_bubble_share"] <= 1
