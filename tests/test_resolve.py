"""Resolving what a run names (none, a name, auto, zb-auto, a CSV) into its schedule, without the CLI."""

from __future__ import annotations

from dataclasses import replace

import pytest

import pipesched
from pipesched import ConfigError, RunSpec, ScheduleChoice, resolve_schedule
from pipesched.memory import Recomputed
from pipesched.schedule_files import csv_text


def test_a_name_is_built_for_the_ranks_and_none_is_the_reference():
    resolved = resolve_schedule(ScheduleChoice("zb-v", ranks=2, microbatches=4))
    assert resolved.schedule.orders == pipesched.build_schedule("zb-v", 2, 4).orders
    assert resolved.recompute == Recomputed() and not resolved.recompute and resolved.profile is None
    assert resolve_schedule(ScheduleChoice("none")).schedule is None
    assert resolve_schedule(ScheduleChoice("1f1b", ranks=2)).schedule.microbatches == 8  # train's default


@pytest.mark.parametrize("format", ["compute_only", "compute_comms"])
def test_a_csv_of_either_format_is_read_validated_and_checked_against_the_flags(tmp_path, format):
    path = tmp_path / "s.csv"
    path.write_text(csv_text(pipesched.build_schedule("interleaved-zb", 2, 4), format))
    assert resolve_schedule(ScheduleChoice(csv=path, ranks=2)).schedule.orders == pipesched.build_schedule("interleaved-zb", 2, 4).orders
    with pytest.raises(ConfigError, match="holds 2 ranks, but --ranks is 4"):
        resolve_schedule(ScheduleChoice(csv=path, ranks=4))
    with pytest.raises(ConfigError, match="has 4 microbatches but --microbatches is 6"):
        resolve_schedule(ScheduleChoice(csv=path, ranks=2, microbatches=6))


def test_a_byte_limit_needs_a_schedule_that_measures_and_measuring_needs_the_run():
    with pytest.raises(ConfigError, match=r"^--activation-limit 1 MiB: a size in bytes needs --schedule auto or zb-auto"):
        ScheduleChoice("1f1b", limit_bytes=2**20)
    with pytest.raises(ConfigError, match="--schedule zb-auto measures the model first"):
        resolve_schedule(ScheduleChoice("zb-auto", limit_bytes=2**20))
    assert ScheduleChoice("auto").profiles() and ScheduleChoice("zb-auto").measures == "zb-auto"
    assert not ScheduleChoice("zb-auto", costs=pipesched.Costs(1, 1, 1)).profiles()  # given costs: no profile
    assert ScheduleChoice("auto", csv="x.csv").measures is None  # a CSV is already planned


def test_the_stages_a_schedule_chose_to_recompute_come_with_it_unless_the_run_names_its_own():
    pytest.importorskip("torch")  # zb-auto is planned for the run's model (its blocks)
    said: list[str] = []
    choice = ScheduleChoice("zb-auto", ranks=2, microbatches=4, memory_limit=0.8, recompute_input=0.1,
                            costs=pipesched.Costs(1, 1, 1))
    resolved = resolve_schedule(choice, RunSpec("mlp", 16), said.append)
    assert resolved.profile is None  # given costs and share: nothing to measure
    assert str(resolved.recompute) == "0,1,2,3" and any("--recompute overrides it" in line for line in said)
    assert not resolve_schedule(replace(choice, recompute="none"), RunSpec("mlp", 16), said.append).recompute


def test_which_stages_recompute_is_one_type_from_every_spelling():
    assert Recomputed.parse("all") == Recomputed(None) and str(Recomputed(None)) == "all"
    assert Recomputed.parse(" none ") == Recomputed.parse(None) == Recomputed() and str(Recomputed()) == "none"
    assert Recomputed.parse("2,0") == Recomputed.parse([0, 2]) == Recomputed(frozenset({0, 2}))
    assert str(Recomputed.parse("2,0")) == "0,2"
    dualpipe = pipesched.build_schedule("dualpipe", 2, 4)
    assert Recomputed.parse("0").of(dualpipe) == {0, 2}  # model stage 0 in both copies (stages 0-1, 2-3)
    with pytest.raises(ConfigError, match="give all, none, or stage indices"):
        ScheduleChoice("1f1b", recompute="0,x")  # refused before anything is built
    with pytest.raises(ConfigError, match="recompute names stage 5, but the model has stages 0 to 1"):
        resolve_schedule(ScheduleChoice("1f1b", ranks=2, recompute="5"))
