"""V-Half and V-Min at the controllable-memory paper's numbers (Qi et al., NeurIPS 2024).

- no longer than the authors' own builder (zbv_greedy.py; its makespans in tests/golden) at
  the same peak, for every p and m recorded there;
- the paper's bubble formulas (half and two thirds of 1F1B's, ``3(p-1)`` at unit costs) hold
  once the steady state exists (``m >= 2p``), and the peaks never pass (p+2)//2 and (p+4)//3;
- under any costs, never slower than our other V builders at the same limit (zb-v at the
  limit, v-min inside v-half's budget), nor than the paper's construction timed under them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cost_strategies
from pipesched import Costs, Schedule, build_schedule, simulate
from pipesched.placement import v_placement
from pipesched.schedules.v_blocks import v_half_offsets, v_min_offsets
from pipesched.schedules.v_compact import compacted_orders

GOLDEN = json.loads((Path(__file__).parent / "golden" / "v_family_paper_builder.json").read_text())
BUDGET = {"v-half": lambda p: (p + 2) // 2, "v-min": lambda p: (p + 4) // 3}
BUBBLE_FRACTION_OF_1F1B = {"v-half": 1 / 2, "v-min": 2 / 3}
OFFSETS = {"v-half": v_half_offsets, "v-min": v_min_offsets}
EPS = 1e-9


def _paper_construction(name: str, p: int, m: int) -> Schedule:
    orders = compacted_orders(p, m, OFFSETS[name])
    return Schedule(p, m, v_placement(p), tuple(map(tuple, orders)), name="paper")


@pytest.mark.parametrize("name", ["v-half", "v-min"])
def test_our_compaction_matches_the_authors_builder_everywhere_recorded(name):
    for row in (r for r in GOLDEN["schedules"] if r["family"] == name):
        result = simulate(_paper_construction(name, row["ranks"], row["microbatches"]))
        assert (result.makespan, result.max_peak_memory) == (row["makespan"], row["peak"]), row


@pytest.mark.parametrize("row", GOLDEN["schedules"][::10], ids=lambda r: f"{r['family']}-p{r['ranks']}-m{r['microbatches']}")
def test_no_longer_than_the_authors_builder_at_its_peak(row):
    p, m = row["ranks"], row["microbatches"]
    result = simulate(build_schedule(row["family"], p, m))
    assert result.max_peak_memory <= min(row["peak"], BUDGET[row["family"]](p)) + EPS
    assert result.makespan <= row["makespan"] + EPS


@pytest.mark.parametrize("name", ["v-half", "v-min"])
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_published_bubble_once_the_steady_state_exists(name, data):
    p = data.draw(st.integers(1, 16), label="p")
    m = data.draw(st.integers(2 * p, 64), label="m")
    result = simulate(build_schedule(name, p, m))
    assert result.max_peak_memory <= BUDGET[name](p) + EPS
    one_f_one_b_bubble = 3 * (p - 1)
    assert result.makespan - 3 * m <= BUBBLE_FRACTION_OF_1F1B[name] * one_f_one_b_bubble + EPS


def _other_v_builders_at(limit: float, p: int, m: int, costs: Costs):
    """Our other V-placed schedules built at ``limit`` (zb-v honours any limit; v-min, when its
    own budget is no larger)."""
    yield build_schedule("zb-v", p, m, costs=costs, memory_limit=limit)
    if BUDGET["v-min"](p) <= limit:
        yield build_schedule("v-min", p, m, costs=costs)


@pytest.mark.parametrize("name", ["v-half", "v-min"])
@settings(max_examples=5, deadline=None)
@given(p=st.integers(2, 16), m=st.integers(1, 64), costs=cost_strategies.costs())
def test_never_slower_than_our_other_v_builders_or_the_paper_construction(name, p, m, costs):
    limit = BUDGET[name](p)
    ours = simulate(build_schedule(name, p, m, costs=costs), costs)
    assert ours.max_peak_memory <= limit + EPS
    for rival in (_paper_construction(name, p, m), *_other_v_builders_at(limit, p, m, costs)):
        result = simulate(rival, costs)
        if result.max_peak_memory <= limit + EPS:
            assert ours.makespan <= result.makespan + EPS, rival.name


@pytest.mark.parametrize("name", ["v-half", "v-min"])
@pytest.mark.parametrize("p,m", [(4, 16), (8, 32), (16, 48)])
def test_compaction_keeps_the_block_peak_and_never_lengthens_it(name, p, m):
    from pipesched.schedules.v_blocks import block_orders

    as_is = Schedule(p, m, v_placement(p), tuple(map(tuple, block_orders(p, m, OFFSETS[name]))))
    before, after = simulate(as_is), simulate(_paper_construction(name, p, m))
    assert after.max_peak_memory <= before.max_peak_memory
    assert after.makespan <= before.makespan
    if name == "v-half":
        assert after.makespan < before.makespan  # the repeated V-Half block idles in its cool-down
