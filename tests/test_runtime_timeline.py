"""Measured timelines against the simulator: median costs, predicted and replayed makespans."""

import pytest

import pipesched
from pipesched.execution import Span
from pipesched.runtime.metering.timeline import (
    calibrated_comm,
    compare_to_simulation,
    mean_costs,
    median_costs,
    replayed_makespan,
)


def simulated_timeline(schedule, delay_after=None, delay=0.0):
    """The simulator's own timeline (unit costs), every later action of a rank pushed back by
    ``delay`` from ``delay_after`` on: a runtime that lost ``delay`` there."""
    timeline = []
    for rank in pipesched.simulate(schedule).timeline:
        shift, spans = 0.0, []
        for span in rank:
            if delay_after is not None and span.action == delay_after:
                shift = delay
            spans.append(Span(span.action, span.start + shift, span.end + shift))
        timeline.append(spans)
    return timeline


def test_a_perfect_runtime_replays_to_its_own_makespan():
    schedule = pipesched.build_schedule("1f1b", 2, 4)
    timeline = simulated_timeline(schedule)
    assert replayed_makespan(schedule, timeline, 0.0) == pytest.approx(12 + 3)
    c = compare_to_simulation(schedule, [timeline], 0.0)
    assert c.ratio == pytest.approx(1.0)
    assert c.replay_ratio == pytest.approx(1.0)


def test_time_lost_between_actions_shows_in_the_replay_ratio():
    schedule = pipesched.build_schedule("1f1b", 2, 4)
    last = schedule.rank_actions(0)[-1]
    timeline = simulated_timeline(schedule, delay_after=last, delay=3.0)
    c = compare_to_simulation(schedule, [timeline], 0.0)
    assert c.replay_ratio == pytest.approx(18 / 15)
    assert c.measured_makespan == pytest.approx(18)


def test_median_costs_are_per_stage_and_kind():
    schedule = pipesched.build_schedule("zb-h1", 2, 4)
    costs = median_costs([simulated_timeline(schedule)])
    assert costs == {(s, k): 1.0 for s in range(2) for k in "FIW"}


def test_a_preempted_action_moves_the_mean_cost_but_not_the_median():
    schedule = pipesched.build_schedule("1f1b", 2, 4)
    timeline = simulated_timeline(schedule)
    first_forward = timeline[0][0]
    timeline[0][0] = Span(first_forward.action, first_forward.start, first_forward.end + 4.0)  # lost its core
    assert median_costs([timeline])[(0, "F")] == 1.0
    assert mean_costs([timeline])[(0, "F")] == pytest.approx((5.0 + 3 * 1.0) / 4)


def test_the_calibrated_message_delay_reproduces_the_measured_steps():
    schedule = pipesched.build_schedule("zb-v", 2, 8)
    for true_delay in (0.0, 0.3, 1.5):
        measured = [list(rank) for rank in pipesched.simulate(schedule, pipesched.Costs(comm=true_delay)).timeline]
        assert calibrated_comm(schedule, [measured], floor=0.0) == pytest.approx(true_delay, abs=1e-6)
    assert calibrated_comm(schedule, [measured], floor=2.0) == 2.0  # never under the measured latency
