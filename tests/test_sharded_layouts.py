"""The planning core of sharded stages (no torch): bytes a rank holds under a layout, and the
layouts refused before any rank starts. The runtime's measurements against these predictions
are in tests/test_sharded_stages.py."""

from __future__ import annotations

import pytest

from pipesched.errors import ConfigError
from pipesched.layout_refusals import check_layout, check_reduction, check_stage_shards
from pipesched.parallel_layout import ParallelLayout
from pipesched.sharded_bytes import ParamSpec, chunk_rows, largest_rank_state_bytes, rank_state_bytes, tp_dims


def test_pieces_are_cut_as_torch_chunk_cuts_them():
    # torch.chunk(5 rows, 4) gives pieces of 2, 2, 1 rows and nothing for the fourth
    assert [chunk_rows(5, 4, i) for i in range(4)] == [2, 2, 1, 0]
    assert [chunk_rows(8, 2, i) for i in range(2)] == [4, 4]


def test_tensor_parallel_styles_split_the_linear_dims_megatron_splits():
    assert tp_dims("colwise") == (0, 0)  # output rows of (out, in) and the bias
    assert tp_dims("rowwise") == (1, None)  # input columns; the bias stays whole
    assert tp_dims("colwise", transposed=True) == (1, 0)  # Conv1D's (in, out) weight
    assert tp_dims("rowwise", transposed=True) == (0, None)


def test_a_colwise_weight_is_divided_by_tp_then_by_dp_shard():
    layout = ParallelLayout(pp=1, dp_shard=2, tp=2)
    held = rank_state_bytes([ParamSpec((8, 4), tp_dim=0)], layout)
    assert held.params == held.grads == 2 * 4 * 4  # (8/2 = 4 rows) / 2 shards, 4 bytes each
    assert held.optimizer == 2 * 2 * 4 * 4 + 4  # AdamW's two moments and its step scalar
    assert held.gathered_params == held.unsharded_grads == 4 * 4 * 4  # the tp piece, gathered


def test_an_interleaved_weight_is_sharded_by_fsdp_on_its_input_features():
    # Phi-3's fused q|k|v (FUSED_STYLES): tp takes 3 of 6 rows, FSDP then half of the 4 columns
    # (on its rows it would pad 3 rows to 2 + 2, and the second shard would hold one)
    layout = ParallelLayout(pp=1, dp_shard=2, tp=2)
    fused = [ParamSpec((6, 4), tp_dim=0, fsdp_dim=1)]
    first, second = (rank_state_bytes(fused, layout, 0, s, slots=2) for s in range(2))
    assert first.params == second.params == 3 * 2 * 4
    assert first.optimizer == second.optimizer == 2 * 3 * 2 * 4 + 4


def test_a_fused_weights_input_features_dp_shard_does_not_divide_are_refused():
    from pipesched.runtime.sharding.tp_plans import param_specs
    from torch import nn

    # torch 2.13's FSDP2 shards a dim other than 0 only evenly (it raises inside every rank)
    block = nn.Module()
    block.self_attn = nn.Module()
    block.self_attn.qkv_proj = nn.Linear(6, 18, bias=False)
    stage = param_specs(block, {"self_attn.qkv_proj": "colwise_fused3"})  # Phi-3's q|k|v
    assert [s.fsdp_dim for s in stage] == [1]  # the input features
    check_stage_shards(ParallelLayout(pp=1, dp_shard=2, tp=2), [stage])
    with pytest.raises(ConfigError, match="dp_shard=4 does not divide the 6 input features of a fused projection "
                                          "in stage 0") as err:
        check_stage_shards(ParallelLayout(pp=1, dp_shard=4, tp=2), [stage])
    assert "\n" not in str(err.value)


def test_fsdp_pads_every_shard_to_the_first_one_and_the_optimizer_holds_only_its_piece():
    layout = ParallelLayout(pp=1, dp_shard=2)
    bias = [ParamSpec((3,))]
    first, second = (rank_state_bytes(bias, layout, 0, s, slots=2) for s in range(2))
    assert first.params == second.params == 2 * 4  # padded to ceil(3/2) = 2 elements
    assert (first.optimizer, second.optimizer) == (2 * 2 * 4 + 4, 2 * 1 * 4 + 4)
    assert largest_rank_state_bytes(bias, layout) == first


def test_replicated_parameters_are_not_divided_by_tp():
    norm = [ParamSpec((6,), tp_dim=None)]
    assert rank_state_bytes(norm, ParallelLayout(pp=1, tp=2)).params == 6 * 4


def test_a_product_of_dimensions_other_than_the_world_is_refused():
    with pytest.raises(ConfigError, match="needs 8 processes, not 4"):
        check_layout(ParallelLayout(pp=2, dp_shard=2, tp=2), 4)


@pytest.mark.parametrize("what, sizes", [("attention heads", dict(heads=6)), ("key-value heads", dict(kv_heads=3)),
                                         ("hidden size", dict(hidden=30))])
def test_tp_must_divide_heads_and_hidden_size(what, sizes):
    with pytest.raises(ConfigError, match=f"tp=4 does not divide the model's .* {what}"):
        check_layout(ParallelLayout(pp=1, tp=4), 4, **sizes)


def test_more_shards_than_a_stage_has_elements_to_give_are_refused():
    stage = [ParamSpec((2,)), ParamSpec((2, 3))]  # two rows along the sharded dim
    check_stage_shards(ParallelLayout(pp=1, dp_shard=2), [stage])
    with pytest.raises(ConfigError, match="dp_shard=4 cuts stage 0 into more shards than it has elements") as err:
        check_stage_shards(ParallelLayout(pp=1, dp_shard=4), [stage])
    assert "\n" not in str(err.value)


def test_a_reduction_gloo_cannot_run_is_refused():
    layout = ParallelLayout(pp=1, dp_shard=2)
    with pytest.raises(ConfigError, match="gloo cannot run FSDP's bfloat16 gradient reduction .* PREMUL_SUM"):
        check_reduction(layout, "gloo", "bfloat16", divide_factor=8.0, force_sum=False)
    check_reduction(layout, "gloo", "bfloat16", divide_factor=8.0, force_sum=True)  # what sharded stages do
    check_reduction(layout, "gloo", "bfloat16", divide_factor=2.0, force_sum=False)  # = dp_shard: AVG
    check_reduction(layout, "gloo", "float16", divide_factor=8.0, force_sum=False)  # SUM with pre/post divide
    check_reduction(layout, "nccl", "bfloat16", divide_factor=8.0, force_sum=False)
