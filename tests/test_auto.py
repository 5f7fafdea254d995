"""zb-auto: valid under any costs and limit, never worse than what it searches, the ZB figures."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cost_strategies
from pipesched import ConfigError, Costs, build_schedule, simulate, validate
from pipesched.auto import build_auto

SKEWED = Costs(F=1, B=1.4, W=0.6, comm=0.1)


def skewed_with_heavy_ends(p: int) -> Costs:
    return Costs(F=1, B=1.4, W=0.6, comm=0.1, stage_multipliers=(1.3,) + (1.0,) * (p - 2) + (1.3,))


costs_strategy = cost_strategies.costs()


@settings(max_examples=30, deadline=None)
@given(
    p=st.integers(1, 6), m=st.integers(1, 14), costs=costs_strategy,
    limit_extra=st.floats(0, 2), objective=st.sampled_from(["makespan", "span"]),
)
def test_every_result_is_valid_and_within_the_limit(p, m, costs, limit_extra, objective):
    limit = 1 + limit_extra * p  # anywhere from one microbatch's activations to 2p+1
    schedule = build_auto(p, m, costs, memory_limit=limit, objective=objective, milp=False)
    validate(schedule)  # structure and freedom from deadlock
    result = simulate(schedule, costs)
    assert result.max_peak_memory <= limit + 1e-9
    assert result.busy == pytest.approx([m * (costs.F + costs.B + costs.W)] * p)
    if limit >= p and objective == "makespan":
        one_f_one_b = simulate(build_schedule("1f1b", p, m), costs)
        assert result.makespan <= one_f_one_b.makespan + 1e-9


@pytest.mark.parametrize("p", [4, 8, 16])
def test_unit_costs_reach_zb_1p_at_1f1b_memory(p):
    for m in (2 * p, 3 * p, 4 * p):
        result = simulate(build_auto(p, m, milp=False))
        assert result.span <= 3 * m + (p - 1) + 1e-9
        assert result.max_peak_memory <= p


@pytest.mark.parametrize("p", [4, 8, 16])
def test_unit_costs_reach_zero_bubble_at_twice_the_memory(p):
    for m in (3 * p, 4 * p):
        schedule = build_schedule("zb-auto", p, m, memory_limit=2 * p, objective="span")
        result = simulate(schedule)
        assert result.span == pytest.approx(3 * m)
        assert result.max_peak_memory <= 2 * p


@pytest.mark.parametrize("p, m", [(4, 8), (4, 16), (8, 16)])
@pytest.mark.parametrize("heavy_ends", [False, True])
def test_skewed_costs_never_slower_than_a_handcrafted_schedule_that_fits(p, m, heavy_ends):
    costs = skewed_with_heavy_ends(p) if heavy_ends else SKEWED
    auto = simulate(build_auto(p, m, costs, milp=False), costs)
    assert auto.max_peak_memory <= p
    for name in ("1f1b", "zb-h1", "zb-h2", "interleaved-zb", "zb-v"):
        try:
            other = simulate(build_schedule(name, p, m, costs=costs, memory_limit=p), costs)
        except ConfigError:
            continue  # needs more memory than p
        assert auto.makespan <= other.makespan + 1e-9, name


@pytest.mark.parametrize("p, m", [(4, 8), (8, 16)])
def test_skewed_costs_beat_handcrafted_zb_v(p, m):
    """Re-placing W for the real costs is what the search adds over fixed programs."""
    auto = simulate(build_auto(p, m, SKEWED, milp=False), SKEWED)
    from pipesched.auto.search import handcrafted_candidates

    best_fixed = min(
        simulate(s, SKEWED).makespan
        for _, s in handcrafted_candidates(p, m, SKEWED, p)
        if simulate(s, SKEWED).max_peak_memory <= p
    )
    assert auto.makespan < best_fixed - 1e-6


def test_objective_span_and_makespan_are_both_honoured():
    by_span = simulate(build_auto(4, 12, memory_limit=8, objective="span", milp=False))
    by_makespan = simulate(build_auto(4, 12, memory_limit=8, objective="makespan", milp=False))
    assert by_span.span <= by_makespan.span + 1e-9
    assert by_makespan.makespan <= by_span.makespan + 1e-9


def test_chunks_restricts_the_search():
    assert build_schedule("zb-auto", 4, 8, chunks=1).chunks == 1
    assert build_schedule("zb-auto", 4, 8, chunks=2).chunks == 2
    assert build_schedule("zb-auto", 4, 8).meta["origin"]


@pytest.mark.parametrize("limit", [0.5, 0.99])
def test_a_limit_below_one_microbatch_names_the_smallest_feasible(limit):
    with pytest.raises(ConfigError, match="smallest feasible limit is 1"):
        build_schedule("zb-auto", 4, 8, memory_limit=limit)


def test_unknown_objective_is_refused():
    with pytest.raises(ConfigError, match="makespan, span"):
        build_schedule("zb-auto", 4, 8, objective="fastest")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--memory-limit", "0.5"], "smallest feasible limit is 1"),
        (["--costs", "1,nan,1"], "cost B must be a finite number from 1e-06 to 1e+09, got nan"),
        (["--costs", "1,0,1"], "cost B must be a finite number from 1e-06 to 1e+09, got 0.0"),
        (["--costs", "-1,1,1"], "cost F must be a finite number from 1e-06 to 1e+09, got -1.0"),
        (["--stage-multipliers", "1,2,3"], "3 stage multipliers do not fit 4 stages"),
        (["--stage-multipliers", "1,nan,1,1"], "stage multiplier 1"),
        (["--objective", "fast"], "use one of makespan, span"),
        (["--memory-limit", "nan"], "is not a size"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(cli, args, message):
    out = cli("simulate", "zb-auto", "-p", "4", "-m", "8", *args)
    assert out.returncode == 2
    assert message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_cli_objective_reaches_the_builder(cli):
    out = cli("simulate", "zb-auto", "-p", "4", "-m", "12", "--memory-limit", "8",
                  "--objective", "span", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["span"] == pytest.approx(36)
