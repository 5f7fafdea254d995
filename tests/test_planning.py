"""The planning-work estimate bounds the real work, its time per action is in proportion to real builds,
and only plans predicted above about a minute are refused, naming a size that fits."""

from __future__ import annotations

import gc
import re
import resource
import subprocess
import sys
import time

import pytest

from pipesched import build_schedule
from pipesched.advise import advise
from pipesched.compare import simulate_all
from pipesched.costs import Costs
from pipesched.errors import ConfigError
from pipesched import planning
from pipesched.planning import (
    MAX_PLANNING_SECONDS, actions_per_schedule, check_schedule_size, planning_seconds, search_width,
)
from pipesched.registry import BuildRequest, families, forget_builds, get_family
from pipesched.simulate import simulate

from conftest import cli_env

SKEWED = Costs(F=1, B=1.4, W=0.6, comm=0.1)  # skewed costs make the searching families search


@pytest.fixture
def simulations(monkeypatch):
    """Count every simulation: the simulator is patched in every module that imported it."""
    real, count = sys.modules["pipesched.simulate"].simulate, [0]

    def counting(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    for name, module in list(sys.modules.items()):
        if name.startswith("pipesched") and getattr(module, "simulate", None) is real:
            monkeypatch.setattr(module, "simulate", counting)
    return count


@pytest.mark.parametrize("name", [f.name for f in families()])
@pytest.mark.parametrize("ranks, microbatches", [(4, 6), (4, 80)])  # with and without the exact refinement
def test_a_family_simulates_no_more_schedules_than_its_search_width(name, ranks, microbatches, simulations):
    family = get_family(name)
    chunks = None if family.searches_chunks else family.default_chunks
    schedule = family.build(BuildRequest(ranks, microbatches, chunks, SKEWED))
    assert simulations[0] <= family.search_width(ranks, microbatches)
    assert len(schedule) <= actions_per_schedule(family, ranks, microbatches, None)


@pytest.mark.parametrize("chunks", [1, 2])
def test_zb_auto_at_a_chunk_count_simulates_no_more_than_its_width_at_that_count(chunks, simulations, monkeypatch):
    """zb-auto asked for one chunk count builds only that count's seeds and greedy placements:
    its width at that count (what the planning bound charges) still covers what it simulates
    and the whole-program executions of its W re-placements (each charged as two schedules)."""
    import pipesched.auto.replaced as replaced

    real, placed = replaced.with_weights_replaced, [0]

    def counting(*args, **kwargs):
        placed[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(replaced, "with_weights_replaced", counting)
    family = get_family("zb-auto")
    family.build(BuildRequest(4, 80, chunks, SKEWED))
    assert placed[0] > 0
    assert 0 < simulations[0] + placed[0] <= family.search_width(4, 80, chunks) < family.search_width(4, 80)


MEASURED_1T = {1: 8.0, 2: 23.9}  # CPU s of zb-auto at p = 64, m = 512 under the 1T layout's costs and limit:
# the most measured on the project's loaded machine, after issue 37's speed-up (benchmarks/RESULTS.md;
# 6.3 and 15.9 on the quiet machine)


def test_zb_auto_at_the_1t_size_is_predicted_above_its_measured_time_and_2_chunks_are_allowed():
    family = get_family("zb-auto")
    for chunks, measured in MEASURED_1T.items():
        assert planning_seconds(family, 64, 512, chunks) >= measured
    assert check_schedule_size(family, 64, 512, 2) <= MAX_PLANNING_SECONDS  # not refused


@pytest.mark.parametrize("limit", [0.8, 1.5])  # recomputing alone fits; recomputing or a leaner order
def test_zb_auto_searching_recomputation_simulates_no_more_than_its_search_width(limit, simulations):
    family = get_family("zb-auto")
    schedule = family.build(BuildRequest(4, 6, None, SKEWED, limit, recompute_input=0.1))
    assert simulations[0] <= search_width(family, 4, 6, recompute_limit=limit)
    assert schedule.meta.get("recompute") is not None


def test_only_a_request_that_searches_recomputation_is_charged_for_its_candidates():
    family = get_family("zb-auto")
    assert search_width(family, 256, 46) == family.search_width(256, 46)
    assert search_width(family, 256, 46, recompute_limit=0.8) > family.search_width(256, 46)
    for one_family in families():  # the others never search it
        if one_family is not family:
            assert search_width(one_family, 4, 8, recompute_limit=0.8) == one_family.search_width(4, 8)
    with pytest.raises(ConfigError) as searching:
        build_schedule("zb-auto", ranks=256, microbatches=4096, memory_limit=0.8, recompute_input=0.1)
    with pytest.raises(ConfigError) as plain:
        build_schedule("zb-auto", ranks=256, microbatches=4096, memory_limit=0.8)
    assert _named_size(str(searching.value)) < _named_size(str(plain.value))


def _named_size(message: str) -> int:
    return int(re.search(r"use (\d+) microbatches or fewer", message).group(1))


def test_a_handcrafted_schedule_has_exactly_the_estimated_actions():
    for name, chunks in (("1f1b", None), ("zb-h1", None), ("zb-v", None), ("interleaved-1f1b", 3)):
        family = get_family(name)
        assert len(build_schedule(name, 4, 8, chunks)) == actions_per_schedule(family, 4, 8, chunks)


def test_zb_auto_on_256_ranks_and_4096_microbatches_is_refused_at_once_naming_what_fits():
    started = time.perf_counter()
    with pytest.raises(ConfigError) as refused:
        build_schedule("zb-auto", ranks=256, microbatches=4096)
    assert time.perf_counter() - started < 5
    message = str(refused.value)
    assert "min of CPU" in message and "1f1b, zb-h1" in message
    fits, family = _named_size(message), get_family("zb-auto")
    assert planning_seconds(family, 256, fits, None) <= MAX_PLANNING_SECONDS < planning_seconds(family, 256, fits + 1, None)
    check_schedule_size(family, 256, fits, None)  # the suggestion is itself accepted


CONSTRUCTIONS = [f.name for f in families() if f.search_width(64, 512) == 1]


@pytest.mark.parametrize("ranks, microbatches", [(64, 512), (128, 1024)])
def test_constructions_and_zb_v_at_equal_costs_plan_large_pipelines_without_refusal(ranks, microbatches):
    for name in CONSTRUCTIONS + ["zb-v"]:
        family = get_family(name)
        check_schedule_size(family, ranks, microbatches, None, searches=family.searches_for(ranks, Costs(), None))
    check_schedule_size(get_family("1f1b"), 256, 4096, None)  # 2.1M actions: about 15 s, 0.6 GB


def test_zb_v_at_equal_costs_builds_its_program_alone_as_the_bound_assumes(simulations):
    family = get_family("zb-v")
    assert not family.searches_for(8, Costs(), None) and family.searches_for(8, SKEWED, None)
    assert family.searches_for(8, Costs(), 4)  # below p M_B the program does not fit: it searches
    build_schedule("zb-v", 8, 32)
    assert simulations[0] == 1  # its program, against the work bound


def test_simulate_zb_v_on_64_ranks_and_512_microbatches_takes_seconds():
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-m", "pipesched", "simulate", "zb-v", "-p", "64", "-m", "512", "--json"],
                         capture_output=True, text=True, env=cli_env(), timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert out.returncode == 0, out.stderr
    assert (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) < 5  # CPU seconds


def _cpu_seconds(plan) -> float:
    """The best of three CPU times of ``plan()``, with this process's objects frozen out of the
    garbage collector: a full collection here scans everything earlier tests left alive (torch,
    models), which the console script never holds. One such collection made a 0.03 s build take
    0.15 s here and 0.26 s in CI; a noisy neighbour's cache misses are not the planner's either."""
    taken = []
    for _ in range(3):
        forget_builds()  # built again each time, not taken from the search's memo
        gc.collect()
        gc.freeze()
        try:
            started = time.process_time()
            plan()
            taken.append(time.process_time() - started)
        finally:
            gc.unfreeze()
    return min(taken)


def _taken_over_predicted(name, ranks, microbatches, costs) -> float:
    taken = _cpu_seconds(lambda: simulate(build_schedule(name, ranks, microbatches, costs=costs), costs))
    return taken / planning_seconds(get_family(name), ranks, microbatches, None)


PROJECT_MACHINE_SPEED = 0.5  # the fixture's figure on the project's machine, at its highest (0.4 quiet)


@pytest.fixture(scope="module")
def machine_speed() -> float:
    """This machine's CPU time per predicted second for the simplest kind of planning (1f1b's
    construction). The rates were measured on the project's 2-core machine, where it is 0.4-0.5;
    ``benchmarks/planning_rates.py --check`` holds them to that machine. Here they are checked
    against each other, and a stated time against this machine's speed, so the test holds on a
    slower machine too."""
    return _taken_over_predicted("1f1b", 32, 256, None)


# one family of each other kind of planning, at a size of a fraction of a second to a few seconds
RATE_CASES = [("interleaved-zb", 16, 64, SKEWED), ("v-min", 16, 64, SKEWED),
              ("zb-auto", 8, 32, SKEWED)]  # zb-auto at 8 x 32 runs its exact refinement (MILP)


@pytest.mark.parametrize("name, ranks, microbatches, costs", RATE_CASES)
def test_each_kind_of_planning_is_charged_in_proportion_to_its_real_time(name, ranks, microbatches, costs,
                                                                          machine_speed):
    # measured on the project's machine: 0.9x (search), 1.2x (greedy), 1.9x (zb-auto's MILP, C code)
    # the construction's ratio; a rate an order of magnitude off would misjudge what fits
    relative = _taken_over_predicted(name, ranks, microbatches, costs) / machine_speed
    assert 1 / 8 <= relative <= 4, (get_family(name).planning, relative)


@pytest.mark.parametrize("name, ranks, costs", [("1f1b", 64, None), ("interleaved-zb", 8, SKEWED), ("zb-v", 8, SKEWED)])
def test_a_refusal_names_a_size_that_finishes_within_its_stated_time(name, ranks, costs, monkeypatch, machine_speed):
    monkeypatch.setattr(planning, "MAX_PLANNING_SECONDS", 1.0)  # a one-second budget: the same rule, faster
    with pytest.raises(ConfigError) as refused:
        build_schedule(name, ranks, 100_000, costs=costs)
    message = str(refused.value)
    stated = re.search(r"or fewer \(about ([\d.]+) (ms|s)\)", message)
    assert stated, message
    seconds = float(stated.group(1)) / (1000 if stated.group(2) == "ms" else 1)
    size = _named_size(message)
    taken = _cpu_seconds(lambda: simulate(build_schedule(name, ranks, size, costs=costs), costs))
    # within the stated time on the project's machine; on a slower one, in proportion to its speed
    assert taken <= 1.25 * seconds * max(1.0, machine_speed / PROJECT_MACHINE_SPEED)


def test_no_microbatch_count_fits_when_the_ranks_alone_are_too_many():
    with pytest.raises(ConfigError, match="use fewer ranks"):
        build_schedule("v-min", ranks=1_000_000, microbatches=8)


def test_compare_and_advise_refuse_their_total_work_up_front():
    with pytest.raises(ConfigError, match="every schedule at ranks=256 microbatches=4096"):
        simulate_all(256, 4096, None, Costs())
    with pytest.raises(ConfigError, match=r"use \d+ microbatches or fewer"):
        advise(256, microbatches=4096)
