"""Two costs beyond F, B, W that a profile measures: a stage overhead and a fused backward's cost.

The stage overhead is the part of F, I and B that each stage pays whole, whatever its layers: a
rank's ``v`` stages each pay it; one stage per rank runs in exactly the rank's F, B and W (so
every one-chunk schedule is unchanged by it). ``full_backward`` prices a fused backward (action
``B``) apart from ``B + W``; schedules that split the backward never see it. The profile fits
both from other layouts, the advisor and its printed commands carry them, and the command line
takes and checks them.
"""

from __future__ import annotations

import json
import shlex

import pytest

import pipesched
from pipesched import ConfigError, Costs, build_schedule, simulate
from pipesched.advise import advise
from pipesched.advise.costmodel import ScaledCosts
from pipesched.advise.howto import build_call, export_command
from pipesched.registry import get_family
from pipesched.training.profile import fitted_cost


def _durations(schedule, costs) -> dict[str, float]:
    return {a.kind: e - s for rank in simulate(schedule, costs).timeline for a, s, e in rank}


def test_each_of_a_ranks_stages_pays_the_overhead_whole_and_w_pays_none():
    costs = Costs(F=2, B=3, W=1, stage_overhead=0.5)
    two_chunks = build_schedule("interleaved-zb", ranks=2, microbatches=4, chunks=2)
    assert _durations(two_chunks, costs) == {"F": 0.5 + 1.5 / 2, "I": 0.5 + 2.5 / 2, "W": 0.5}
    fused = build_schedule("interleaved-1f1b", ranks=2, microbatches=2, chunks=2)
    assert _durations(fused, costs)["B"] == 0.5 + (3 + 1 - 0.5) / 2


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "gpipe"])
def test_one_stage_per_rank_is_unchanged_by_it(name):
    schedule = build_schedule(name, ranks=4, microbatches=8)
    for mults in (None, (0.7, 1.0, 1.0, 1.3)):  # an imbalanced model too: each stage's own share is its F
        plain = Costs(F=1, B=1.4, W=0.6, stage_multipliers=mults)
        with_overhead = Costs(F=1, B=1.4, W=0.6, stage_multipliers=mults, stage_overhead=0.3)
        assert simulate(schedule, with_overhead).makespan == simulate(schedule, plain).makespan


def test_more_chunks_pay_more_so_a_large_overhead_turns_the_ranking():
    schedules = {1: build_schedule("zb-h1", ranks=4, microbatches=8),
                 **{v: build_schedule("interleaved-zb", ranks=4, microbatches=8, chunks=v) for v in (2, 4)}}
    free = [simulate(schedules[v], Costs()).makespan for v in (1, 2, 4)]
    costly = [simulate(schedules[v], Costs(stage_overhead=0.4)).makespan for v in (1, 2, 4)]
    assert free[2] < free[0]  # without it, more chunks shrink the bubble
    assert costly[0] < costly[1] < costly[2]


@pytest.mark.parametrize("value, match", [(1.0, "below F"), (-0.1, "stage overhead"), (float("nan"), "stage overhead")])
def test_an_overhead_not_below_f_and_b_or_not_a_number_is_refused(value, match):
    with pytest.raises(ConfigError, match=match):
        Costs(stage_overhead=value)


def test_a_smaller_microbatch_keeps_the_overhead_whole():
    model = ScaledCosts(Costs(F=4, B=4, W=2, stage_overhead=1.0))
    half = model.costs(stages=4, placement="loop", scale=0.5)
    assert (half.F, half.B, half.W, half.stage_overhead) == (2.5, 2.5, 1.0, 1.0)


def test_the_fit_gives_back_the_overhead_a_simulated_ratio_came_from():
    one = build_schedule("zb-h1", ranks=2, microbatches=8)
    chunked = build_schedule("zb-v", ranks=2, microbatches=8, chunks=2)
    costs = Costs(F=3.0, B=2.9, W=2.2, comm=0.3)
    truth = 0.4
    ratio = simulate(chunked, Costs(F=3.0, B=2.9, W=2.2, comm=0.3, stage_overhead=truth)).makespan / simulate(one, costs).makespan
    assert fitted_cost(one, chunked, costs, "stage_overhead", ratio) == pytest.approx(truth, rel=1e-6)
    assert fitted_cost(one, chunked, costs, "stage_overhead", 0.5) == 0.0  # two chunks faster than the model allows
    assert fitted_cost(one, chunked, costs, "stage_overhead", 10.0) == pytest.approx(0.9 * 2.9)  # at most 0.9 of F, B


def test_a_fused_backward_costs_full_backward_and_a_split_one_is_unchanged():
    costs = Costs(F=2, B=3, W=1, stage_overhead=0.5, full_backward=3.5)
    assert _durations(build_schedule("1f1b", ranks=2, microbatches=2), costs)["B"] == 3.5
    two_chunks = build_schedule("interleaved-1f1b", ranks=2, microbatches=2, chunks=2)
    assert _durations(two_chunks, costs)["B"] == 3.5 / 2 + 0.5 * (1 - 1 / 2)
    split = build_schedule("zb-h1", ranks=4, microbatches=8)
    assert simulate(split, costs).makespan == simulate(split, Costs(F=2, B=3, W=1, stage_overhead=0.5)).makespan
    half = ScaledCosts(Costs(F=4, B=4, W=2, stage_overhead=1.0, full_backward=5.0)).costs(4, "loop", 0.5)
    assert half.full_backward == 1.0 + (5.0 - 1.0) * 0.5  # scaled with the microbatch, its overhead kept


@pytest.mark.parametrize("value, match", [(0.2, "above the stage overhead"), (float("nan"), "full backward"), (0, "full backward")])
def test_a_full_backward_not_above_the_overhead_or_not_a_number_is_refused(value, match):
    with pytest.raises(ConfigError, match=match):
        Costs(stage_overhead=0.5, full_backward=value)


def test_the_printed_call_and_export_command_carry_them(cli, tmp_path):
    costs = Costs(1, 1.4, 0.6, comm=0.1, stage_overhead=0.2, full_backward=1.8)
    families = [get_family(n) for n in ("1f1b", "interleaved-zb", "zb-v")]
    best = advise(4, 4, microbatches=8, costs=costs, families=families, workers=1).recommended
    call = build_call(best, 4)
    assert "stage_overhead=0.2" in call and "full_backward=1.8" in call
    assert simulate(eval(call, {"pipesched": pipesched}), best.costs).makespan == pytest.approx(best.makespan)
    command = shlex.split(export_command(best, 4))
    assert command[command.index("--stage-overhead") + 1] == "0.2"
    assert command[command.index("--full-backward") + 1] == "1.8"
    target = tmp_path / "best.csv"
    assert cli(*command[1:], "-o", str(target)).returncode == 0


def test_the_command_line_takes_them_and_refuses_bad_ones_in_one_line(cli):
    flags = ["-p", "2", "-m", "4", "-v", "2", "--stage-overhead", "0.5", "--full-backward", "1.5", "--json"]
    expected = Costs(stage_overhead=0.5, full_backward=1.5)
    for name in ("interleaved-zb", "interleaved-1f1b"):  # a split backward and a fused one
        shown = cli("simulate", name, *flags)
        assert shown.returncode == 0, shown.stderr
        built = build_schedule(name, ranks=2, microbatches=4, chunks=2)
        assert json.loads(shown.stdout)["makespan"] == pytest.approx(simulate(built, expected).makespan)
    for bad, named in ((["simulate", "1f1b", "--stage-overhead", "1"], "stage overhead"),
                       (["advise", "--profile", "--stage-overhead", "0.1"], "--stage-overhead"),
                       (["simulate", "1f1b", "--full-backward", "0"], "full backward"),
                       (["advise", "--profile", "--full-backward", "2"], "--full-backward")):
        refused = cli(*bad)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert [line for line in refused.stderr.splitlines() if line.strip()][-1].startswith("pipesched: error:")
        assert named in refused.stderr
