"""Partitioning blocks into stages: counts, balance per placement, names of the unpipelined model."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pipesched.balance import balanced_counts  # noqa: E402
from pipesched.errors import ConfigError  # noqa: E402
from pipesched.placement import loop_placement, v_placement  # noqa: E402
from pipesched.runtime.engine.shapes import infer_boundary_shapes  # noqa: E402
from pipesched.runtime.stages.partition import (  # noqa: E402
    block_counts,
    build_stage,
    stage_block_ranges,
)
from pipesched.training.models import get_model  # noqa: E402

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


class _PositionsWithoutDevice(torch.nn.Module):
    """Builds its positions with no device, as many model wrappers do: meta cannot run it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 6)

    def forward(self, x):
        return self.lin(x) + torch.arange(x.shape[1]).float()[:, None]


def test_shapes_come_from_one_real_forward_where_meta_cannot_run_a_block():
    rng = torch.get_rng_state()
    shapes = infer_boundary_shapes(lambda i: _PositionsWithoutDevice(), [range(0, 1)], torch.zeros(2, 3, 4))
    assert [tuple(b.entries[0].shape) for b in shapes] == [(2, 3, 6)]
    assert torch.equal(torch.get_rng_state(), rng)  # the seeded copies left the generators as they were


def test_shapes_of_modules_already_prepared_for_the_split_backward_and_of_tuples():
    from pipesched.runtime.engine.split_backward import (
        WeightGradStash,
        make_weight_grads_deferrable,
    )

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU())
    make_weight_grads_deferrable(model, WeightGradStash())
    (boundary,) = infer_boundary_shapes(lambda i: model, [range(0, 1)], torch.zeros(2, 4))
    assert tuple(boundary.entries[0].shape) == (2, 4) and boundary.keys is None
    pair = infer_boundary_shapes(lambda i: torch.nn.Identity(), [range(0, 1)], (torch.zeros(2, 4), torch.zeros(2, dtype=torch.long)))
    assert [e.grad for e in pair[0].entries] == [True, False] and pair[0].gradients().entries == pair[0].entries[:1]
