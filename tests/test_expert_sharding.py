"""Expert parallelism composed further (docs/expert-parallel.md): each EP rank's experts
FSDP-sharded over the ranks holding the same experts (``--dp-shard 4 --ep 2``: two ranks share
each half of the experts, each keeping a quarter), and expert parallelism beside tensor
parallelism (``--tp 2 --ep 2``: each tp rank runs its own EP group on the same tokens, the
experts whole on every tp rank).

Exactness as in tests/test_expert_parallel.py (its module docstring): float64 throughout, the
only differences from one process are sums taken in another order (an expert's matmul on other
rows, a token's gradient gathered from its choices in another order, FSDP's reduce-scatter
summing the replicas' gradients), each float64's rounding (1e-16); three SGD steps keep them far
below ``TOL``. One 4-rank launch (pipeline 1) holds both layouts, under a schedule of two stages
on the rank (zb-v: split backward) and one of two looped stages (interleaved-1f1b)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402
from expert_cases import check_equal_to_one_process, launch  # noqa: E402
from hf_cases import make_batch, make_model  # noqa: E402

import pipesched  # noqa: E402
from pipesched.parallel_layout import ParallelLayout  # noqa: E402
from pipesched.sharded_bytes import ParamSpec, rank_state_bytes  # noqa: E402

pytestmark = pytest.mark.torch
TOL = 1e-10  # float64 throughout, sums in other orders (module docstring)
BATCHES = [make_batch(step, 8, 16) for step in range(3)]
SHARDED, WITH_TP = "mixtral zb-v dp_shard4 ep2", "mixtral interleaved-1f1b dp_shard2 tp2 ep2"
RUNS = [(SHARDED, "mixtral", "zb-v", 2, {"dp_shard": 4, "ep": 2}),
        (WITH_TP, "mixtral", "interleaved-1f1b", 2, {"dp_shard": 2, "tp": 2, "ep": 2})]


def test_each_ep_ranks_experts_are_sharded_over_the_ranks_holding_the_same_ones():
    experts = ParamSpec((4, 128, 32), expert=True)  # 4 experts stacked on dim 0, float32
    layout = ParallelLayout(1, dp_shard=4, ep=2)
    assert layout.expert_shards == 2  # data ranks 0 and 2 hold experts 0-1, 1 and 3 experts 2-3
    first, second = (rank_state_bytes([experts], layout, expert_rank=r, slots=0) for r in (0, 1))
    assert first.params == second.params == 1 * 128 * 32 * 4  # one of four experts on each rank
    assert first.gathered_params == 2 * 128 * 32 * 4  # gathered: the EP rank's two
    assert ParallelLayout(1, dp_shard=2, ep=2).expert_shards == 1  # no rank holds the same experts
    assert ParallelLayout(1, dp_shard=4).expert_shards == 1  # no ep: FSDP shards the experts with the rest
    assert ParallelLayout(1, dp_replicate=4, tp=2, ep=2).expert_shards == 1  # replicas keep them whole
    assert ParallelLayout(1, dp_replicate=2, dp_shard=4, ep=2).expert_shards == 2  # HSDP: shards inside a replica
    assert ParallelLayout(1, dp_replicate=2, dp_shard=2, ep=4).expert_shards == 1  # an EP group across replicas


@pytest.fixture(scope="module")
def launched():  # the tests using it are slow: a 4-rank launch
    """One launch of 4 ranks (pipeline 1) for both layouts of :data:`RUNS`."""
    return launch([(label, kind, pipesched.build_schedule(name, 1, m), sizes) for label, kind, name, m, sizes in RUNS],
                  BATCHES)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_three_sgd_steps_equal_the_model_in_one_process(launched):
    check_equal_to_one_process(launched, [label for label, *_ in RUNS], BATCHES, TOL)


@pytest.mark.slow
def test_every_parameter_is_held_once_in_the_world_when_the_experts_are_sharded(launched):
    for label, *_ in RUNS:
        for rank in launched[label]["bytes"]:
            assert rank["measured"] == rank["predicted"], label
    total = sum(p.numel() for p in make_model("mixtral", torch.float64).parameters()) * 8
    # FSDP's four shards of the dense part, and of the experts two EP halves times two shards (no padding:
    # every sharded dim of the tiny Mixtral divides)
    assert sum(rank["measured"]["params"] for rank in launched[SHARDED]["bytes"]) == total


def test_experts_no_row_reached_still_get_a_zero_gradient():
    """FSDP reduce-scatters the experts' gradients from every rank holding them: a rank whose
    experts no token chose this step must give zeros, not nothing (as one process's stacked weight
    gets zeros for them)."""
    import transformers as tf

    from pipesched.runtime.sharding.expert_parallel import expert_outputs

    config = tf.MixtralConfig(hidden_size=32, intermediate_size=64, num_local_experts=2, num_experts_per_tok=1)
    experts = tf.models.mixtral.modeling_mixtral.MixtralExperts(config)
    rows = torch.zeros(0, 32)
    expert_outputs(experts, rows, torch.zeros(0, dtype=torch.long), rows.dtype).sum().backward()
    for weight in (experts.gate_up_proj, experts.down_proj):
        assert weight.grad is not None and weight.grad.shape == weight.shape and not weight.grad.any()
