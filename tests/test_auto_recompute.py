"""zb-auto searches recomputation as a dimension under a memory limit, and only where it is faster."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli
from pipesched import build_schedule
from pipesched.auto import build_auto
from pipesched.auto.recompute import recomputing_candidates
from pipesched.costs import Costs
from pipesched.errors import ConfigError
from pipesched.memory import MemorySizes, Recompute, Recomputed, StageMemory, schedule_recompute
from pipesched.resolve import recompute_of
from pipesched.schedule import Schedule
from pipesched.simulate import simulate

SKEWED = Costs(F=1, B=1.4, W=0.6, comm=0.1)
INPUT = 0.1  # a recomputed stage keeps a tenth of its activations: its input


def auto(limit=None, recompute_input=INPUT, ranks=4, microbatches=8):
    return build_auto(ranks, microbatches, SKEWED, memory_limit=limit, recompute_input=recompute_input, milp=False)


def test_a_limit_below_every_stored_schedule_is_met_by_recomputing():
    with pytest.raises(ConfigError, match="below one microbatch's activations"):
        auto(0.8, recompute_input=None)  # no order that stores its activations fits below 1 M_B
    with pytest.raises(ConfigError):
        build_schedule("v-min", 4, 8, costs=SKEWED, memory_limit=0.8)
    schedule = auto(0.8)
    chosen = schedule_recompute(schedule)
    assert chosen is not None and chosen.input_share == INPUT
    result = simulate(schedule, SKEWED)
    assert result.max_peak_memory <= 0.8
    assert result.metrics()["recompute"] == sorted(chosen.stages)


def test_a_limit_below_what_even_recomputing_reaches_names_the_leanest_need():
    with pytest.raises(ConfigError, match="even recomputing activations: the leanest needs 0.55"):
        auto(0.5)
    with pytest.raises(ConfigError, match="below a recomputed stage's input"):
        auto(0.05)


def test_without_a_limit_zb_auto_never_recomputes():
    assert schedule_recompute(auto(None)) is None
    at_1f1b_memory = auto(4)
    assert schedule_recompute(at_1f1b_memory) is None
    assert at_1f1b_memory.orders == auto(4, recompute_input=None).orders


def test_recomputing_wins_only_where_it_is_faster_than_every_leaner_schedule():
    # at 1.5 M_B the leaner orders (fewer microbatches in flight, v-min, v-half at the limit) are slow
    chosen = auto(1.5)
    assert schedule_recompute(chosen) is not None
    time = simulate(chosen, SKEWED).makespan
    leaner = [auto(1.5, recompute_input=None)] + [
        build_schedule(name, 4, 8, costs=SKEWED, memory_limit=1.5) for name in ("v-min", "v-half")
    ]
    assert all(time < simulate(s, SKEWED).makespan for s in leaner)
    assert chosen.meta["without_recompute"] == simulate(leaner[0], SKEWED).makespan
    # at 2 M_B v-min's block fits and is faster than every recomputing candidate
    kept = auto(2)
    assert schedule_recompute(kept) is None
    recomputing = [s for _, s in recomputing_candidates(4, 8, SKEWED, 2, INPUT)]
    assert recomputing
    assert all(simulate(kept, SKEWED).makespan < simulate(s, SKEWED).makespan for s in recomputing)


def test_a_schedule_carrying_its_recompute_is_timed_and_counted_with_it():
    plain = build_schedule("1f1b", 2, 4, costs=SKEWED)
    recomputing = Schedule(plain.ranks, plain.microbatches, plain.placement, plain.orders,
                           meta={"recompute": Recompute(frozenset({0}), 0.25)})
    in_bytes = MemorySizes((StageMemory(4, 4),) * 2, (1.0,) * 2, frozenset({0}))
    assert simulate(recomputing, SKEWED).makespan == simulate(plain, SKEWED, in_bytes).makespan
    assert simulate(recomputing, SKEWED).makespan > simulate(plain, SKEWED).makespan
    # rank 0 holds two stored microbatches (2 M_B); recomputed: two inputs and one rebuilt
    assert simulate(plain).peak_memory == (2, 1)
    assert simulate(recomputing).peak_memory == (0.25 + 1, 1)
    assert simulate(recomputing, SKEWED, in_bytes).peak_memory_bytes == (1 + 4, 4)


def test_train_applies_the_chosen_recompute_unless_told_otherwise():
    schedule = build_schedule("zb-auto", 2, 4, memory_limit=0.8, recompute_input=INPUT)
    chosen = schedule_recompute(schedule).spec()
    said: list[str] = []
    assert str(recompute_of(schedule, None, said.append)) == chosen and "--recompute overrides it" in said[0]
    assert recompute_of(schedule, Recomputed.parse("none"), said.append) == Recomputed()
    assert not recompute_of(build_schedule("1f1b", 2, 4), None, said.append) and len(said) == 1


def test_the_command_line_reports_which_stages_recompute_and_refuses_it_without_a_limit(tmp_path):
    out = run_cli("export", "zb-auto", "-p", "2", "-m", "4", "--memory-limit", "0.8", "--recompute-input", "0.1",
                  "-o", str(tmp_path / "plan.csv"))
    assert out.returncode == 0, out.stderr
    assert "recompute: stages 0,1,2,3 (" in out.stderr and "nothing fits without recomputing" in out.stderr
    assert "train it with --recompute 0,1,2,3" in out.stderr  # the CSV holds the order only
    simulated = run_cli("simulate", "--csv", str(tmp_path / "plan.csv"), "--json")
    assert json.loads(simulated.stdout)["recompute"] == []
    refused = run_cli("simulate", "zb-auto", "--recompute-input", "0.1")
    assert refused.returncode == 2
    assert refused.stderr.strip() == ("pipesched: error: --recompute-input needs --memory-limit: "
                                      "without a limit recomputing only costs time")


def test_the_share_derived_from_sizes_is_what_a_recomputed_stage_keeps_of_a_stored_one():
    # a stage of 3 blocks keeps 12 and takes inputs of 1: recomputed block by block it keeps 3
    three_blocks = MemorySizes((StageMemory(12, 9),), (1.0,), blocks=(3,))
    assert three_blocks.recompute_share() == 0.25
    assert three_blocks.with_recompute({0}).effective()[0].keep == 0.25 * 12
    # one share for the M_B model: the stage that saves the least
    mixed = MemorySizes((StageMemory(12, 9), StageMemory(10, 10)), (1.0, 1.0), blocks=(3, 1))
    assert mixed.recompute_share() == 0.25


def test_simulate_derives_the_share_from_the_activation_bytes_and_the_flag_overrides_it():
    args = ("simulate", "zb-auto", "-p", "4", "-m", "8", "--costs", "1,1.4,0.6", "--comm", "0.1", "--json")
    derived = run_cli(*args, "--activation-bytes", "1GiB,1GiB,64MiB", "--activation-limit", "800MiB")
    assert derived.returncode == 0, derived.stderr
    metrics = json.loads(derived.stdout)
    assert metrics["recompute"] and max(metrics["peak_memory_bytes"]) <= 800 * 2**20
    # a V's stage is half a rank's share: a recomputed one keeps 2 x 64 MiB of its 512 MiB
    assert tuple(metrics["peak_memory"]) == simulate(auto(800 / 1024, recompute_input=0.125)).peak_memory
    overridden = run_cli(*args, "--activation-bytes", "1GiB,1GiB,64MiB", "--activation-limit", "800MiB",
                         "--recompute-input", "0.5")
    assert tuple(json.loads(overridden.stdout)["peak_memory"]) == simulate(auto(800 / 1024, recompute_input=0.5)).peak_memory
    assert json.loads(overridden.stdout)["peak_memory"] != metrics["peak_memory"]
    unknown_input = run_cli(*args, "--activation-bytes", "1GiB", "--activation-limit", "800MiB")
    assert unknown_input.returncode == 2 and "below one microbatch's activations" in unknown_input.stderr


def test_compare_and_draw_let_zb_auto_recompute(tmp_path):
    compared = run_cli("compare", "-p", "4", "-m", "8", "--costs", "1,1.4,0.6", "--comm", "0.1",
                       "--memory-limit", "1.5", "--recompute-input", "0.1", "--json")
    assert compared.returncode == 0, compared.stderr
    row = next(r for r in json.loads(compared.stdout) if r["schedule"] == "zb-auto")
    assert row["recompute"] == sorted(schedule_recompute(auto(1.5)).stages) and row["fits"]
    drawn = run_cli("draw", "zb-auto", "-p", "2", "-m", "4", "--memory-limit", "0.8", "--recompute-input", "0.1",
                    "-o", str(tmp_path / "chart.svg"))
    assert drawn.returncode == 0, drawn.stderr
    assert (tmp_path / "chart.svg").stat().st_size > 0
