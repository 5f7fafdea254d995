"""Where each rank gathers its sharded stages (issue 29 item 3): torch's window of 3 by default,
or placed from the costs (``plan_programs(..., plan="auto")``, ``export --gather-plan auto``),
timed by the simulator with each rank's gathers on its communication lane.

torch's runtime running the planned CSVs on FSDP2 stages is in tests/test_torch_program.py.
"""

from __future__ import annotations

import pytest
from fuzz_cases import problems, run_batch

import pipesched
from pipesched import ConfigError
from pipesched.runtime.program.planned_gathers import GatherCosts, plan_programs
from pipesched.runtime.program.program import lower_all
from pipesched.runtime.program.program_check import check_programs
from pipesched.schedule_files import csv_text, parse_csv
from pipesched.simulate import simulate


def _each(g: float, stages: int) -> dict[int, float]:
    return {s: g for s in range(stages)}


def test_torchs_window_is_the_default_and_its_gathers_cost_what_the_lane_says():
    schedule = pipesched.build_schedule("1f1b", 2, 4)  # unit costs: F 1, B 2
    default = plan_programs(schedule)
    assert default.placement == "window 3" and [p.cells() for p in default.programs] == [p.cells() for p in lower_all(schedule)]
    assert default.step_time == simulate(schedule).makespan  # no gather times: the schedule's own step
    for g in (0.5, 1.0):  # rank 0 waits for its gather; rank 1's lands at g, before its input at 1 + g
        assert plan_programs(schedule, GatherCosts(_each(g, 2))).step_time == simulate(schedule).makespan + g


@pytest.mark.parametrize("ranks, g", [(2, 0.5), (4, 2.0)])
def test_every_family_planned_passes_the_program_check_and_reads_back(ranks, g):
    for family in pipesched.families():
        try:
            schedule = pipesched.build_schedule(family.name, ranks, 8)
        except ConfigError:
            continue
        planned = plan_programs(schedule, GatherCosts(_each(g, schedule.stages)), plan="auto")
        check_programs(planned.programs)
        assert planned.step_time <= plan_programs(schedule, GatherCosts(_each(g, schedule.stages))).step_time
        text = csv_text(schedule, "compute_comms", planned.programs)
        read = parse_csv(text)  # the file's program is checked as it is read
        assert read.orders == schedule.orders
        assert text.splitlines() == [",".join(p.cells()) for p in planned.programs]
        # and pipesched's lowering of what it read keeps the file's gathers: its runtime runs them
        assert [p.cells() for p in lower_all(read)] == [p.cells() for p in planned.programs], family.name


def test_with_four_stages_a_rank_the_planned_gathers_hide_where_torchs_window_gathers_again():
    schedule = pipesched.build_schedule("interleaved-1f1b", 2, 8, 4)  # F 0.25 a stage: a warm-up bubble
    alone = simulate(schedule).makespan
    torch_window = plan_programs(schedule, GatherCosts(_each(1.0, 8)))
    planned = plan_programs(schedule, GatherCosts(_each(1.0, 8)), plan="auto")
    assert planned.placement == "auto" and planned.step_time < torch_window.step_time
    assert sum(c.endswith("UNSHARD") for p in torch_window.programs for c in p.cells()) > 8  # gathers again
    assert sum(c.endswith("UNSHARD") for p in planned.programs for c in p.cells()) == 8  # once a stage
    cheap = _each(0.25, 8)  # a gather no longer than a forward: all but rank 0's first one hide
    assert plan_programs(schedule, GatherCosts(cheap), plan="auto").step_time == alone + 0.25
    held = plan_programs(schedule, GatherCosts(cheap, _each(1.0, 8), limit=3), plan="auto")
    torch_held = plan_programs(schedule, GatherCosts(cheap, _each(1.0, 8)))
    assert held.step_time == torch_held.step_time == alone + 0.25
    assert max(held.peak_bytes) == 2 and max(torch_held.peak_bytes) == 3  # as fast, holding one stage fewer


def test_the_memory_limit_is_the_program_checks_count_and_a_plan_that_cannot_fit_is_refused():
    schedule = pipesched.build_schedule("interleaved-1f1b", 2, 8, 4)
    for limit in (1, 2, 3):
        planned = plan_programs(schedule, GatherCosts(_each(2.0, 8), _each(1.0, 8), limit), plan="auto")
        assert max(planned.peak_bytes) <= limit
    with pytest.raises(ConfigError, match="do not fit the memory limit of 0.5 bytes: the least a placement holds is 1"):
        plan_programs(schedule, GatherCosts(_each(2.0, 8), _each(1.0, 8), 0.5), plan="auto")


def test_export_gather_plan_flags(tmp_path):
    base = ["export", "interleaved-1f1b", "-p", "2", "-m", "8", "--chunks", "4"]
    comms = [*base, "--format", "compute_comms"]
    cases = {
        "auto": ([*comms, "--gather-plan", "auto", "--gather-time", "1", "-o", "{dir}/auto.csv"], None),
        "limit": ([*comms, "--gather-plan", "auto", "--gather-time", "1", "--gather-limit", "2", "-o", "{dir}/two.csv"], None),
        "compute only": ([*base, "--gather-plan", "auto", "--gather-time", "1"], "need --format compute_comms"),
        "unknown": ([*comms, "--gather-plan", "best"], "--gather-plan 'best' is not known: use one of torch, auto"),
        "no time": ([*comms, "--gather-plan", "auto"], "--gather-plan auto needs each stage's all-gather time (--gather-time)"),
        "time without auto": ([*comms, "--gather-time", "1"], "--gather-time and --gather-limit go with --gather-plan auto"),
        "wrong count": ([*comms, "--gather-plan", "auto", "--gather-time", "1,2"], "--gather-time takes one value or one per stage (8), got 2"),
        "negative": ([*comms, "--gather-plan", "auto", "--gather-time", "-1"], "--gather-time must be a finite number"),
        "zero limit": ([*comms, "--gather-plan", "auto", "--gather-time", "1", "--gather-limit", "0"], "--gather-limit must be at least 1"),
    }
    for (label, (_, why)), outcome in zip(cases.items(), run_batch([argv for argv, _ in cases.values()], tmp_path)):
        assert not problems(outcome), (label, outcome)
        if why is None:
            assert outcome.code == 0 and "gathers placed by" in outcome.stderr, (label, outcome.stderr)
        else:
            assert outcome.code == 2 and why in outcome.stderr, (label, outcome.stderr)
    schedule = pipesched.build_schedule("interleaved-1f1b", 2, 8, 4)
    planned = plan_programs(schedule, GatherCosts(_each(1.0, 8), _each(1.0, 8), 2), plan="auto")
    assert (tmp_path / "two.csv").read_bytes().decode() == csv_text(schedule, "compute_comms", planned.programs)
    assert parse_csv((tmp_path / "auto.csv").read_text()).orders == schedule.orders


def test_train_runs_a_planned_csvs_gathers_as_written_and_refuses_them_broken_in_one_line(tmp_path):
    """Refused before any rank starts: a compute_comms CSV computing a stage it has not gathered,
    --gather-plan auto on a CSV that places its gathers already, and on whole stages."""
    schedule = pipesched.build_schedule("interleaved-1f1b", 2, 4)
    planned = plan_programs(schedule, GatherCosts(_each(1.0, 4), _each(1.0, 4), 1), plan="auto")
    rows = [",".join(p.cells()) for p in planned.programs]
    (tmp_path / "planned.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "bad.csv").write_text("\n".join([rows[0].replace("0UNSHARD,", "", 1), *rows[1:]]) + "\n")
    train = ["train", "--model", "gpt", "-p", "2", "--batch-size", "8", "--steps", "1"]
    cases = {
        "not gathered": ([*train, "--csv", "{dir}/bad.csv", "--dp-shard", "2"], "rank 0 runs 0F0 while stage 0 is not gathered"),
        "placed twice": ([*train, "--csv", "{dir}/planned.csv", "--dp-shard", "2", "--gather-plan", "auto", "--gather-time", "1"],
                         "--gather-plan auto places the gathers, but planned places them already"),
        "whole stages": ([*train, "-s", "interleaved-1f1b", "--gather-plan", "auto", "--gather-time", "1"],
                         "--gather-plan, --gather-time and --gather-limit go with --dp-shard or --tp"),
    }
    for (label, (_, why)), outcome in zip(cases.items(), run_batch([argv for argv, _ in cases.values()], tmp_path)):
        assert not problems(outcome), (label, outcome)
        assert outcome.code == 2 and why in outcome.stderr and len(outcome.stderr.strip().splitlines()) == 1, (label, outcome.stderr)
