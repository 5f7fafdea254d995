"""The one balancing rule for train's blocks and the advisor's layers: least busiest rank, then
least slowest stage, then the most even stages."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from pipesched.balance import balance_layers, balanced_counts, split_key
from pipesched.placement import loop_placement, v_placement


def _best_key(costs, placement):
    n, stages = len(costs), len(placement)
    return min(split_key(costs, [b - a for a, b in zip((0, *cuts), (*cuts, n))], placement)
               for cuts in itertools.combinations(range(1, n), stages - 1))


PLACEMENTS = st.sampled_from([tuple(range(2)), tuple(range(4)), loop_placement(2, 2), v_placement(2),
                              loop_placement(3, 2), v_placement(3)])


@settings(max_examples=150, deadline=None)
@given(placement=PLACEMENTS, middle=st.integers(0, 8), unit=st.sampled_from([0.5, 1.0, 2.0]),
       ends=st.tuples(st.sampled_from([0.0, 0.02, 1.0, 1.7, 3.0]), st.sampled_from([0.0, 0.125, 1.0, 2.5])))
def test_models_of_equal_layers_are_cut_as_well_as_trying_every_cut(placement, middle, unit, ends):
    """Counts suffice when the blocks between the ends cost the same; no cut does better."""
    costs = [ends[0]] + [unit] * max(middle, len(placement) - 2) + [ends[1]]
    counts = balanced_counts(costs, placement)
    assert sum(counts) == len(costs) and min(counts) >= 1
    assert split_key(costs, counts, placement) == _best_key(costs, placement)


@settings(max_examples=60, deadline=None)
@given(placement=PLACEMENTS, costs=st.lists(st.sampled_from([0.1, 0.5, 1.0, 2.0]), min_size=6, max_size=9))
def test_uneven_blocks_are_cut_by_trying_every_cut(placement, costs):
    counts = balanced_counts(costs, placement)
    assert split_key(costs, counts, placement) == _best_key(costs, placement)


def test_ties_go_to_the_more_even_split_with_extra_blocks_late():
    assert balanced_counts([1.0] * 10, range(4)) == [2, 2, 3, 3]  # not 1,3,3,3: the same slowest stage
    assert balanced_counts([1.0] * 8 + [0.125], range(2)) == [4, 5]  # the light head takes one more


def test_the_advisors_layer_split_is_trains_block_split_with_the_embedding_and_head_as_blocks():
    for layers, placement, head in ((22, tuple(range(8)), 2.0), (13, v_placement(4), 2.0), (10, loop_placement(4, 2), 1.5)):
        layer_split = balance_layers(layers, len(placement), 1.0, 0.0, head, placement, first_alone=True)
        blocks = balanced_counts([0.0] + [1.0] * layers + [head], placement)
        assert [n + (s == 0) + (s == len(placement) - 1) for s, n in enumerate(layer_split)] == blocks


def test_a_large_model_is_cut_by_counting():
    counts = balanced_counts([0.02] + [1.0] * 96 + [0.5], v_placement(16))
    assert len(counts) == 32 and sum(counts) == 98 and max(counts) - min(counts) <= 2
