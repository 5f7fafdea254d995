"""Every generator, any ranks and microbatches: valid, deadlock-free, and the published figures.

Unit costs (F = B = W = 1, no latency) unless a test says otherwise.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipesched
from pipesched import ConfigError, build_schedule, simulate, validate

RANKS = st.integers(1, 16)
MICROBATCHES = st.integers(1, 64)
CHUNKS = st.integers(1, 4)
FAMILY_NAMES = pipesched.schedule_names()


def refuses_size(name: str, p: int, m: int) -> bool:
    """DualPipe pairs rank r with rank p-1-r and feeds each end its own microbatches."""
    return name == "dualpipe" and (p % 2 == 1 or m < 2)


def accepts(name: str, chunks: int) -> bool:
    family = pipesched.get_family(name)
    return chunks >= family.min_chunks and (family.max_chunks is None or chunks <= family.max_chunks)


@pytest.mark.parametrize("name", FAMILY_NAMES)
@settings(max_examples=25, deadline=None)
@given(p=RANKS, m=MICROBATCHES, v=CHUNKS)
def test_every_generator_is_valid_for_any_size(name, p, m, v):
    if refuses_size(name, p, m) and accepts(name, v):
        with pytest.raises(ConfigError, match="even number of ranks|microbatches >= 2"):
            build_schedule(name, ranks=p, microbatches=m, chunks=v)
        return
    if not accepts(name, v):
        with pytest.raises(ConfigError, match="chunks"):
            build_schedule(name, ranks=p, microbatches=m, chunks=v)
        return
    schedule = build_schedule(name, ranks=p, microbatches=m, chunks=v)
    validate(schedule)
    assert schedule.ranks == p and schedule.microbatches == m and schedule.chunks == v
    result = simulate(schedule)
    # every rank does its full share: m * (F + B + W) = 3m under unit costs
    assert result.busy == pytest.approx([3.0 * m] * p)
    # no schedule is slower than running the microbatches one after another through the pipe
    assert result.makespan <= 3 * m * p + 1e-9


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@settings(max_examples=60, deadline=None)
@given(p=RANKS, m=MICROBATCHES)
def test_gpipe_and_1f1b_makespan_and_memory(name, p, m):
    result = simulate(build_schedule(name, ranks=p, microbatches=m))
    assert result.makespan == 3 * (m + p - 1)
    expected_peak = m if name == "gpipe" else min(p, m)
    assert result.max_peak_memory == expected_peak


@settings(max_examples=80, deadline=None)
@given(p=RANKS, m=MICROBATCHES, v=st.integers(2, 4))
def test_interleaved_1f1b_matches_megatron_and_never_loses_to_1f1b(p, m, v):
    result = simulate(build_schedule("interleaved-1f1b", ranks=p, microbatches=m, chunks=v))
    if m % p == 0:
        assert result.makespan == pytest.approx(3 * m + 3 * (p - 1) / v)
        assert result.max_peak_memory <= (2 * (p - 1) + (v - 1) * p + 1) / v + 1e-9
    assert result.makespan <= 3 * (m + p - 1) + 1e-9


@pytest.mark.parametrize("p,m", [(4, 9), (4, 10), (8, 12), (3, 7), (5, 2)])
def test_interleaved_1f1b_schedules_counts_torch_refuses(p, m):
    result = simulate(build_schedule("interleaved-1f1b", ranks=p, microbatches=m, chunks=2))
    assert result.makespan < 3 * (m + p - 1)


@settings(max_examples=80, deadline=None)
@given(p=RANKS, m=MICROBATCHES)
def test_zb_h1_has_a_third_of_1f1b_bubble_at_1f1b_memory(p, m):
    result = simulate(build_schedule("zb-h1", ranks=p, microbatches=m))
    if m >= p:
        assert result.makespan == 3 * m + (p - 1)
        assert result.max_peak_memory <= p
    assert result.makespan <= 3 * (m + p - 1)


@pytest.mark.parametrize("name, peak_per_rank", [("zb-h2", 2), ("zb-v", 1)])
@settings(max_examples=80, deadline=None)
@given(p=RANKS, m=MICROBATCHES)
def test_zero_bubble_span_from_2p_microbatches(name, peak_per_rank, p, m):
    """zb-h2 reaches span 3m at twice 1F1B's memory; zb-v at 1F1B's memory."""
    result = simulate(build_schedule(name, ranks=p, microbatches=m))
    if m >= 2 * p:
        assert result.span == 3 * m
        assert result.max_peak_memory <= peak_per_rank * p
    assert result.makespan <= 3 * (m + p - 1)


@settings(max_examples=30, deadline=None)
@given(p=RANKS, m=MICROBATCHES, v=st.integers(2, 4))
def test_interleaved_zb_stays_within_1f1b_memory_and_beats_it(p, m, v):
    result = simulate(build_schedule("interleaved-zb", ranks=p, microbatches=m, chunks=v))
    assert result.max_peak_memory <= max(p, (v - 1 + p) / v) + 1e-9
    assert result.makespan <= 3 * (m + p - 1) + 1e-9


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_one_rank_is_plain_gradient_accumulation(name):
    family = pipesched.get_family(name)
    if refuses_size(name, 1, 5):
        with pytest.raises(ConfigError, match="even number of ranks"):
            build_schedule(name, ranks=1, microbatches=5)
        return
    schedule = build_schedule(name, ranks=1, microbatches=5)
    result = simulate(schedule)
    assert result.makespan == pytest.approx(15.0)
    assert result.bubble_ratio == pytest.approx(0.0)
    assert schedule.chunks == family.default_chunks


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_fewer_microbatches_than_stages_is_scheduled_not_refused(name):
    result = simulate(build_schedule(name, ranks=8, microbatches=2))
    assert result.makespan <= 3 * (2 + 8 - 1) + 1e-9


def test_skewed_costs_respect_the_cost_model():
    costs = pipesched.Costs(F=1, B=1.4, W=0.6, comm=0.1)
    for name in FAMILY_NAMES:
        schedule = build_schedule(name, ranks=4, microbatches=8, costs=costs)
        result = simulate(schedule, costs)
        assert result.busy == pytest.approx([8 * 3.0] * 4), name
