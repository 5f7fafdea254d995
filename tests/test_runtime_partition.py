"""Partitioning blocks into stages: counts, balance per placement, names of the unpipelined model."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pipesched.errors import ConfigError  # noqa: E402
from pipesched.placement import loop_placement, v_placement  # noqa: E402
from pipesched.runtime.models import get_model  # noqa: E402
from pipesched.runtime.partition import (  # noqa: E402
    balanced_counts, block_counts, build_stage, infer_boundary_shapes, stage_block_ranges,
)

pytestmark = pytest.mark.torch


def test_even_split_puts_extra_blocks_on_the_last_stages():
    assert block_counts(9, 2) == [4, 5]
    assert block_counts(10, 4) == [2, 2, 3, 3]


@pytest.mark.parametrize("counts", [[1, 2], [0, 9], [3, 3, 3]])
def test_explicit_counts_must_cover_every_block_once(counts):
    with pytest.raises(ConfigError, match="do not fit"):
        block_counts(9, 2, counts)


def test_more_stages_than_blocks_is_refused():
    with pytest.raises(ConfigError, match="8 stages but the model has only 6 blocks"):
        block_counts(6, 8)


def test_balanced_split_depends_on_the_placement():
    costs = [0.0] + [1.0] * 6 + [0.0]  # light embedding and head around six equal layers
    for placement in (loop_placement(2, 2), v_placement(2), loop_placement(2, 1)):
        counts = balanced_counts(costs, placement)
        load = [0.0, 0.0]
        for stage, r in enumerate(stage_block_ranges(len(costs), len(placement), counts)):
            load[placement[stage]] += sum(costs[i] for i in r)
        assert load == [3.0, 3.0], (placement, counts)


def test_stages_use_the_unpipelined_names_and_weights():
    md = get_model("gpt", layers=2, dim=16, heads=2, context=8)
    reference = md.sequential(seed=5).state_dict()
    ranges = stage_block_ranges(md.num_blocks, 3, [1, 2, 1])
    merged = {}
    for s, blocks in enumerate(ranges):
        merged.update(build_stage(md.build_block, blocks, s, 5, torch.device("cpu")).global_state_dict())
    assert merged.keys() == reference.keys()
    assert all(torch.equal(merged[k], reference[k]) for k in reference)


def test_boundary_shapes_are_inferred_without_weights():
    md = get_model("gpt", layers=2, dim=16, heads=2, context=8)
    x, _ = md.batch(0, 4, 0)
    shapes = infer_boundary_shapes(md.build_block, stage_block_ranges(md.num_blocks, 2, [2, 2]), x)
    assert [tuple(b.entries[0].shape) for b in shapes] == [(4, 8, 16), (4, 8, md.build_block(3).out.out_features)]
