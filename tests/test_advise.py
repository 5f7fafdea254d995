"""The advisor recommends the fastest simulated schedule within the memory limit, and says why."""

from __future__ import annotations

import sys

import pytest

import pipesched
from pipesched import Costs, build_schedule, simulate
from pipesched.advise import NoCandidateFitsError, advise, batch_plan
from pipesched.advise.candidates import chunk_options, divisors, thin
from pipesched.errors import ConfigError
from pipesched.registry import Family, _FAMILIES, register

SKEWED = Costs(1, 1.4, 0.6, comm=0.1)

# zb-auto refines small instances with a time-limited MILP: seconds per build, and what it finds
# can depend on the machine's speed. The grid runs without it; one test below includes it.
FAST = [f for f in pipesched.families() if f.name != "zb-auto"]
HEAVY_ENDS = Costs(1, 1.2, 0.8, comm=0.05, stage_multipliers=(1.3, 1, 1, 1.3))

GRID = [
    (2, 4, Costs(), 2),
    (4, 3, Costs(), 4),
    (4, 8, Costs(), 4),
    (4, 8, SKEWED, 4),
    (4, 16, HEAVY_ENDS, 6),
    (4, 12, SKEWED, None),
    (8, 16, Costs(), 8),
    (8, 24, SKEWED, 12),
    (8, 32, HEAVY_ENDS, 8),
]


def rebuild(row: dict, ranks: int):
    """Rebuild and re-simulate a candidate from its JSON fields alone."""
    c = row["costs"]
    costs = Costs(c["F"], c["B"], c["W"], comm=c["comm"], stage_multipliers=c["stage_multipliers"])
    extra = {"objective": row["objective"]} if row["objective"] else {}
    schedule = build_schedule(row["schedule"], ranks, row["microbatches"], row["chunks"], costs, row["memory_limit"], **extra)
    return simulate(schedule, costs)


@pytest.mark.parametrize("ranks,m,costs,limit", GRID)
def test_recommendation_is_the_fastest_candidate_within_the_limit(ranks, m, costs, limit):
    rows = advise(ranks, limit, microbatches=m, costs=costs, families=FAST).to_json()
    best = rows[0]
    assert best["fits"]
    fitting = [r for r in rows if r["fits"]]
    assert best["makespan"] == pytest.approx(min(r["makespan"] for r in fitting), rel=1e-9)
    again = rebuild(best, ranks)
    assert again.makespan == pytest.approx(best["makespan"])
    assert again.span == pytest.approx(best["span"])
    assert again.max_peak_memory == pytest.approx(best["peak_memory"])
    if limit is not None:
        assert again.max_peak_memory <= limit + 1e-9


@pytest.mark.parametrize("ranks,m,costs,limit", GRID[:5])
def test_no_registered_schedule_within_the_limit_beats_the_recommendation(ranks, m, costs, limit):
    """Independent of the search: build every family at every chunk count the registry allows."""
    best = advise(ranks, limit, microbatches=m, costs=costs, families=FAST).recommended
    for family in FAST:
        for v in chunk_options(family, 4):
            steer = limit if family.uses_memory_limit else None
            try:
                result = simulate(build_schedule(family.name, ranks, m, v, costs, steer), costs)
            except pipesched.PipeschedError:
                continue
            if limit is None or result.max_peak_memory <= limit + 1e-9:
                assert result.makespan >= best.makespan - 1e-9, (family.name, v)


def test_with_every_registered_family_the_recommendation_is_still_the_fastest():
    advice = advise(4, 4, microbatches=8, costs=SKEWED)
    rows = advice.to_json()
    tried = {r["schedule"] for r in rows} | {name for name, *_ in advice.skipped}
    # every family that holds one copy of the weights (dualpipe's two are out of the advisor's model)
    assert tried == {f.name for f in pipesched.families() if f.parameter_copies == 1}
    best = rows[0]
    assert best["makespan"] == pytest.approx(min(r["makespan"] for r in rows if r["fits"]), rel=1e-9)
    assert rebuild(best, 4).makespan <= best["makespan"] + 1e-9  # a time-limited search may only improve


def test_span_objective_ranks_by_span():
    advice = advise(4, 8, microbatches=12, objective="span", families=FAST)
    spans = [c.span for c in advice.fitting]
    assert all(a <= b + 1e-9 for a, b in zip(spans, spans[1:]))


def test_equal_costs_and_limit_p_pick_a_zero_bubble_schedule_and_say_why_1f1b_loses():
    advice = advise(8, 8, microbatches=32, families=FAST)
    best = advice.recommended
    assert pipesched.get_family(best.schedule).split_backward
    assert best.speedup_vs_1f1b > 1.05
    assert "1F1B" in advice.reason
    assert any("1F1B, fits" in note and "slower" in note for note in advice.notes)


def test_few_microbatches_get_a_note_in_every_schedule():
    advice = advise(4, 4, microbatches=4, families=FAST)
    assert any("never fills" in note for note in advice.notes)
    assert all(c.bubble_ratio > 0 for c in advice.fitting)
    plenty = advise(4, 4, microbatches=16, families=FAST)
    assert not any("never fills" in note for note in plenty.notes)


def test_a_limit_nothing_fits_names_the_smallest_feasible_limit():
    fixed = [f for f in FAST if not f.uses_memory_limit]  # each needs what it needs
    with pytest.raises(NoCandidateFitsError, match=r"smallest feasible limit is 4\b.*1f1b"):
        advise(4, 2, microbatches=8, families=fixed)
    if not any(f.uses_memory_limit and f.placement == "v" for f in FAST):
        pytest.skip("needs a V family that honours memory limits")
    with pytest.raises(NoCandidateFitsError, match=r"smallest feasible limit is 1\b") as err:
        advise(4, 0.5, microbatches=8, families=FAST)  # families that honour limits go down to 1
    with pytest.raises(NoCandidateFitsError) as two:  # their leanest builds, on two processes: the same
        advise(4, 0.5, microbatches=8, families=FAST, workers=2)
    assert str(two.value) == str(err.value) and two.value.candidates == err.value.candidates
    floor = advise(4, 1, microbatches=8, families=FAST).recommended
    assert floor.peak_memory <= 1 and floor.schedule in str(err.value)


def test_over_limit_candidates_follow_the_fitting_ones():
    rows = advise(4, 4, microbatches=8, families=FAST).to_json()
    flags = [r["fits"] for r in rows]
    assert flags == sorted(flags, reverse=True)
    assert not all(flags)  # gpipe holds all 8 microbatches


def test_half_of_1f1b_memory_picks_a_low_memory_v_schedule_and_says_why():
    names = pipesched.schedule_names()
    if "v-half" not in names and "v-min" not in names:
        pytest.skip("needs the low-memory V family (v-half, v-min)")
    advice = advise(8, 5, microbatches=32, families=FAST)  # 1F1B needs 8
    best = advice.recommended
    assert best.placement == "v" and best.schedule not in ("gpipe", "1f1b")
    assert best.peak_memory <= 5 + 1e-9
    lean = [c for c in advice.fitting if c.schedule in ("v-half", "v-min")]
    assert lean and best.makespan <= min(c.makespan for c in lean) + 1e-9
    assert "of 1F1B's p" in advice.reason
    assert not advice.baseline.fits
    assert any("needs 8 M_B" in note and "above the limit" in note for note in advice.notes)


def test_global_batch_search_compares_time_for_the_same_samples():
    advice = advise(4, 4, global_batch=64, microbatch_size=4, costs=SKEWED, families=FAST)
    assert advice.plan.reference == 16
    for c in advice.candidates:
        assert c.microbatches * c.microbatch_size == 64
        assert c.costs.F == pytest.approx(SKEWED.F * c.microbatch_size / 4)
        assert c.costs.comm == pytest.approx(SKEWED.comm * c.microbatch_size / 4)
        if c.fits:
            assert c.peak_memory_reference <= 4 + 1e-9
    assert len({c.microbatches for c in advice.candidates}) > 1
    assert any("Microbatches:" in note for note in advice.notes)


def test_overhead_that_does_not_shrink_can_favour_fewer_microbatches():
    free = advise(4, None, global_batch=64, microbatch_size=2, costs=Costs(1, 1, 1), families=FAST)
    assert free.recommended.microbatches == max(free.plan.options)
    costly = advise(4, None, global_batch=64, microbatch_size=2, costs=Costs(1, 1, 1), overhead=0.9, families=FAST)
    assert costly.recommended.microbatches < max(costly.plan.options)


def test_microbatch_options_are_divisors_within_bounds():
    plan = batch_plan(4, global_batch=960, microbatch_size=8, max_microbatches=200)
    assert all(960 % m == 0 and m <= 200 for m in plan.options)
    assert 120 in plan.options and len(plan.options) <= 10
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    assert thin([1, 2, 3, 4, 5, 6], keep=5, limit=3) == [1, 5, 6]


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(global_batch=10, microbatch_size=3), "not divisible"),
        (dict(global_batch=10), "--microbatch-size"),
        (dict(), "--microbatches"),
        (dict(global_batch=12, microbatches=5), "equal microbatches"),
    ],
)
def test_bad_batch_settings_raise_one_clear_error(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        advise(4, 4, **kwargs)


def test_a_newly_registered_family_is_searched_without_changes():
    base = pipesched.get_family("1f1b")
    family = Family(
        name="test-clone", build=lambda *a, **k: base.build(*a, **k), summary="a copy of 1f1b for this test",
        placement="loop", split_backward=False, default_chunks=1, min_chunks=1, max_chunks=1, memory="p",
    )
    register(family)
    try:
        names = {c.schedule for c in advise(4, 4, microbatches=8).candidates}
    finally:
        del _FAMILIES["test-clone"]
    assert "test-clone" in names


def test_parallel_search_gives_the_same_ranking_as_one_process():
    one = advise(4, 4, microbatches=8, costs=SKEWED, families=FAST, workers=1).to_json()
    two = advise(4, 4, microbatches=8, costs=SKEWED, families=FAST, workers=2).to_json()
    assert one == two


def test_large_searches_use_every_core_even_two_small_ones_one_process(monkeypatch):
    from pipesched.advise import parallel
    monkeypatch.setattr(parallel, "local_cores", lambda: 2)
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # an earlier test in this worker may have loaded it
    assert parallel.default_workers(20, parallel.LARGE_WORK_S) == 2
    assert parallel.default_workers(20, parallel.LARGE_WORK_S / 2) == 1
    assert parallel.default_workers(1, 10 * parallel.LARGE_WORK_S) == 1  # one job: nothing to share
    monkeypatch.setitem(sys.modules, "torch", object())
    assert parallel.default_workers(20, 10 * parallel.LARGE_WORK_S) == 1  # no fork once torch runs threads


def test_outcomes_come_back_in_the_items_order_whatever_order_the_workers_take_them():
    from pipesched.advise.parallel import map_outcomes

    def square(x: int) -> int:
        if x == 3:
            raise ConfigError("three")
        return x * x

    items = [1, 2, 3, 4, 5]
    got = map_outcomes(square, items, 2, weights=[1, 5, 2, 4, 3], together=lambda x: x % 2 or None)
    assert [g for i, g in enumerate(got) if i != 2] == [1, 4, 16, 25]
    assert isinstance(got[2], ConfigError) and str(got[2]) == "three"


def test_items_kept_together_run_in_one_worker_in_their_order():
    import os
    from pipesched.advise.parallel import map_outcomes
    got = map_outcomes(lambda x: (x, os.getpid()), list(range(6)), 2, weights=[1] * 6, together=lambda x: x % 2)
    assert [x for x, _ in got] == list(range(6))
    assert len({pid for x, pid in got if x % 2}) == 1 and len({pid for x, pid in got if not x % 2}) == 1


def test_items_kept_together_give_up_their_last_ones_while_heavier_than_a_worker_s_share():
    from pipesched.advise.parallel import _within_share
    weights = [8, 12, 7, 7, 1, 20, 5]  # 60 in all: 30 a worker, of 35 kept together
    assert _within_share([[0, 1, 2, 3, 4], [5], [6]], weights, 2) == [[4], [3], [0, 1, 2], [5], [6]]
    assert _within_share([[0, 1, 2, 3, 4], [5], [6]], weights, 1) == [[0, 1, 2, 3, 4], [5], [6]]
