"""The simulator follows the cost and memory model of DESIGN.md exactly."""

from __future__ import annotations

import pytest

from pipesched import ConfigError, Costs, Schedule, build_schedule, simulate


def test_two_stage_1f1b_by_hand():
    # rank 0: F0 [0,1] F1 [1,2] B0 waits for rank 1's B0 which ends at 4 -> [4,6], B1 [7,9]...
    result = simulate(Schedule.from_csv("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"))
    spans = {str(a): (s, e) for rank in result.timeline for a, s, e in rank}
    assert spans["1F0"] == (1, 2)
    assert spans["1B0"] == (2, 4)  # a full backward costs B + W
    assert spans["0B0"] == (4, 6)
    assert spans["1F1"] == (4, 5)
    assert spans["1B1"] == (5, 7)
    assert spans["0B1"] == (7, 9)
    assert result.makespan == 9 == 3 * (2 + 2 - 1)
    assert result.busy == (6, 6)
    assert result.bubble_ratio == pytest.approx(1 - 12 / 18)
    assert result.peak_memory == (2, 1)


def test_comm_latency_delays_cross_rank_inputs_only():
    costs = Costs(comm=0.5)
    result = simulate(build_schedule("zb-v", ranks=2, microbatches=2), costs)
    spans = {str(a): (s, e) for rank in result.timeline for a, s, e in rank}
    # stage 0 -> 1 crosses ranks; stage 1 -> 2 is the V's turn on rank 1 (free hand-over)
    assert spans["1F0"][0] == pytest.approx(spans["0F0"][1] + 0.5)
    assert spans["2F0"][0] == pytest.approx(spans["1F0"][1])


def test_stage_cost_is_the_rank_share_divided_by_its_stages():
    result = simulate(build_schedule("interleaved-1f1b", ranks=2, microbatches=2, chunks=2), Costs(F=2, B=3, W=1))
    durations = {a.kind: e - s for rank in result.timeline for a, s, e in rank}
    assert durations == {"F": 1.0, "B": 2.0}


def test_stage_multipliers_follow_the_model_depth():
    costs = Costs(stage_multipliers=(2.0, 1.0))
    result = simulate(build_schedule("1f1b", ranks=2, microbatches=1), costs)
    f0 = result.timeline[0][0]
    assert f0.end - f0.start == 2.0
    # the same two factors describe a 4-stage (2-chunk) model: stages 0,1 get 2.0, stages 2,3 get 1.0
    result = simulate(build_schedule("interleaved-1f1b", ranks=2, microbatches=1, chunks=2), costs)
    f = {a.stage: e - s for rank in result.timeline for a, s, e in rank if a.kind == "F"}
    assert f == {0: 1.0, 1: 1.0, 2: 0.5, 3: 0.5}


def test_wrong_number_of_multipliers_is_refused():
    with pytest.raises(ConfigError, match="3 stage multipliers do not fit 4 stages"):
        simulate(build_schedule("1f1b", ranks=4, microbatches=4), Costs(stage_multipliers=(1, 1, 1)))


@pytest.mark.parametrize("field, value", [("F", 0), ("B", -1), ("W", float("nan")), ("comm", -0.1)])
def test_bad_costs_are_refused(field, value):
    with pytest.raises(ConfigError, match=field):
        Costs(**{field: value})


def test_span_differs_from_makespan_when_ranks_start_late():
    result = simulate(build_schedule("zb-h2", ranks=4, microbatches=16))
    assert result.span == 48
    assert result.makespan == 48 + 3


def test_memory_is_held_from_forward_start_to_weight_pass_end():
    result = simulate(Schedule.from_csv("0F0,0F1,0I0,0I1,0W0,0W1\n1F0,1I0,1F1,1I1,1W0,1W1\n"))
    assert result.peak_memory == (2, 2)
    curve = result.memory_curve(1)
    assert max(level for _t, level in curve) == 2
    assert curve[-1][1] == 0


def test_metrics_are_plain_json_numbers():
    metrics = simulate(build_schedule("1f1b", ranks=2, microbatches=4)).metrics()
    for key in ("makespan", "span", "bubble_ratio", "busy", "peak_memory"):
        assert key in metrics


SKEWED = Costs(F=1, B=1.4, W=0.6, comm=0.1)


def _with_rank3_swapped(schedule: Schedule) -> tuple:
    """1f1b's rank 3 runs F0 B0 F1 B1 ...; swap B0 and F1 (still valid, one step slower)."""
    orders = [list(o) for o in schedule.orders]
    orders[3][1], orders[3][2] = orders[3][2], orders[3][1]
    return tuple(tuple(o) for o in orders)


def test_a_schedule_built_from_another_derives_its_own_program():
    # Issue 14: the lowered program and the unit-cost run were cached in ``meta``, which a
    # schedule made from another (meta=..., dataclasses.replace) shares: it simulated the old one.
    import dataclasses

    original = build_schedule("1f1b", 4, 4)
    assert simulate(original, SKEWED).makespan == pytest.approx(22.0)
    swapped = _with_rank3_swapped(original)
    fresh = Schedule(4, 4, original.placement, swapped, name="1f1b")
    same_meta = Schedule(4, 4, original.placement, swapped, name="1f1b", meta=original.meta)
    replaced = dataclasses.replace(original, orders=swapped)
    assert simulate(fresh, SKEWED).makespan == pytest.approx(23.0)
    assert simulate(same_meta, SKEWED).makespan == pytest.approx(23.0)
    assert simulate(replaced, SKEWED).makespan == pytest.approx(23.0)
    assert simulate(replaced).makespan == simulate(fresh).makespan  # the unit-cost run too
    assert replaced.program is not original.program


def test_copies_and_pickles_carry_the_fields_not_the_derived_data():
    import copy
    import pickle

    schedule = build_schedule("zb-v", 2, 4)
    simulate(schedule)
    for other in (copy.copy(schedule), pickle.loads(pickle.dumps(schedule))):
        assert other == schedule
        assert "program" not in vars(other) and "derived" not in vars(other)
        assert simulate(other).makespan == simulate(schedule).makespan


def test_a_renamed_copy_shares_what_its_programs_derived_and_simulates_the_same():
    """The V families hand one pool's winner out under each family's name: the copy's programs
    are the same objects, so it reuses the runs (no second simulation at p = 64, m = 512); a
    schedule carrying ``meta`` (zb-auto's recomputation) gives a copy that derives its own."""
    from dataclasses import replace

    costs = Costs(F=1, B=2, W=1, comm=0.1)
    zbv = replace(build_schedule("zb-v", 4, 8))  # a fresh object: builds are memoized
    before = simulate(zbv, costs).metrics()
    twin = zbv.renamed("v-half")
    assert twin.name == "v-half" and twin.orders is zbv.orders and twin.derived is zbv.derived
    assert simulate(twin, costs).metrics() == {**before, "schedule": "v-half"}
    carried = replace(zbv, meta={"origin": "zb-v"})
    assert carried.renamed("v-half").derived is not carried.derived
