"""The planning-work estimate bounds the real work, and oversized plans are refused up front."""

from __future__ import annotations

import sys
import time

import pytest

from pipesched import build_schedule
from pipesched.advise import advise
from pipesched.compare import simulate_all
from pipesched.costs import Costs
from pipesched.errors import ConfigError
from pipesched.planning import MAX_ACTIONS_BUILT, actions_built, actions_per_schedule, check_schedule_size, search_width
from pipesched.registry import BuildRequest, families, get_family

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
    with pytest.raises(ConfigError, match="use 36 microbatches or fewer"):
        build_schedule("zb-auto", ranks=256, microbatches=4096, memory_limit=0.8, recompute_input=0.1)
    with pytest.raises(ConfigError, match="use 46 microbatches or fewer"):
        build_schedule("zb-auto", ranks=256, microbatches=4096, memory_limit=0.8)


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
    assert "use 46 microbatches or fewer" in message and "1f1b, zb-h1" in message
    family = get_family("zb-auto")
    assert actions_built(family, 256, 46, None) <= MAX_ACTIONS_BUILT < actions_built(family, 256, 47, None)
    check_schedule_size(family, 256, 46, None)  # the suggestion is itself accepted


def test_a_plain_schedule_that_fits_the_budget_is_not_refused():
    check_schedule_size(get_family("1f1b"), 256, 4096, None)  # 2.1M actions: about 10 s, 0.6 GB


def test_no_microbatch_count_fits_when_the_ranks_alone_are_too_many():
    with pytest.raises(ConfigError, match="use fewer ranks"):
        build_schedule("v-min", ranks=100_000, microbatches=8)


def test_compare_and_advise_refuse_their_total_work_up_front():
    with pytest.raises(ConfigError, match="every schedule at ranks=256 microbatches=4096"):
        simulate_all(256, 4096, None, Costs())
    with pytest.raises(ConfigError, match="use 10 microbatches or fewer"):
        advise(256, microbatches=4096)
