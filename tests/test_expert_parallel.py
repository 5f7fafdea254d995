"""Expert parallelism inside stages (``--ep``, ``ep`` in the mesh): each MoE layer's routed experts
split over the data-parallel ranks, tokens dispatched to their experts and combined back with
``all_to_all`` (docs/expert-parallel.md).

Exactness. The router runs on every rank on its own tokens as in one process; only the experts'
compute moves, each (token, expert) pair computed unweighted on the expert's rank, weighted where
the token lives and summed in transformers' order. What differs from one process is where sums
are taken: an expert's matmuls run on another set of rows (its rows from two ranks, in another
order), and the gradient of a token's hidden state gathers its choices' contributions in another
order. In float64 throughout (hf_cases.Float64Throughout) each such difference is float64's
rounding, ~1e-16 relative per operation; three SGD steps through a few layers keep it below
1e-13, so ``TOL`` 1e-10 (the other float64 pipeline tests') holds with room, far inside the 1e-5
asked of these layouts.

The multi-process cases share one 4-rank launch (2 pipeline ranks x 2 data-parallel ranks);
benchmarks/expert_parallel.py runs every layout of the issue (Qwen3-MoE, loop schedules too)."""

from __future__ import annotations

import pytest
from conftest import cli_env, concurrently

pytest.importorskip("transformers")
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from expert_cases import check_equal_to_one_process, launch  # noqa: E402
from hf_cases import make_batch, make_model  # noqa: E402

import pipesched  # noqa: E402
from pipesched.errors import ConfigError  # noqa: E402
from pipesched.parallel_layout import ParallelLayout  # noqa: E402
from pipesched.sharded_bytes import ParamSpec, rank_state_bytes  # noqa: E402

pytestmark = pytest.mark.torch
TOL = 1e-10  # float64 throughout, sums in other orders (module docstring)
SCRIPT = Path(sys.executable).with_name("pipesched")
BATCHES = [make_batch(step, 8, 16) for step in range(3)]
RUNS = [("mixtral 1f1b dp2 ep2", "mixtral", "1f1b", {"dp": 2, "ep": 2}),
        ("mixtral zb-v dp_shard2 ep2", "mixtral", "zb-v", {"dp_shard": 2, "ep": 2}),
        ("deepseek-v3 dualpipev dp2 ep2", "deepseek-v3", "dualpipev", {"dp": 2, "ep": 2})]


def test_ep_borrows_consecutive_data_ranks_and_must_divide_them():
    layout = ParallelLayout(2, dp_replicate=2, dp_shard=2, ep=2)
    assert layout.world == 8  # ep adds no processes
    assert layout.expert_groups(0) == ((0, 1), (0, 2))  # splits with shard 1, same experts as replica 1's shard 0
    assert layout.expert_groups(3) == ((2, 3), (1, 3))
    with pytest.raises(ConfigError, match="ep=3 does not divide the 4 data-parallel ranks"):
        ParallelLayout(2, dp_replicate=2, dp_shard=2, ep=3)


def test_experts_count_once_per_ep_group_in_the_predicted_bytes():
    experts = ParamSpec((4, 128, 32), expert=True)  # 4 experts stacked on dim 0, float32
    dense = ParamSpec((32, 32))
    whole = rank_state_bytes([experts, dense], ParallelLayout(1, dp_shard=2), slots=2)
    split = rank_state_bytes([experts, dense], ParallelLayout(1, dp_shard=2, ep=2), slots=2)
    assert whole.params == (4 * 128 * 32 + 16 * 32) * 4  # a spec marked expert at ep 1 (the runtime marks none): whole
    assert split.params == (2 * 128 * 32 + 16 * 32) * 4  # two of four experts, whole, beside the dense shard
    assert split.gathered_params == 32 * 32 * 4  # only the dense weight is gathered


def _console(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=200, env=cli_env())


SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, bos_token_id=0, eos_token_id=1, pad_token_id=2)


def _configs() -> dict:
    import transformers as tf

    return {"mixtral": tf.MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2),
            "llama": tf.LlamaConfig(**SMALL), "olmoe": tf.OlmoeConfig(**SMALL, num_experts=4, num_experts_per_tok=2)}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_train_refuses_in_one_line_before_any_rank_starts(tmp_path):
    for name, config in _configs().items():
        config.to_json_file(tmp_path / f"{name}.json")
    train = ["train", "-s", "1f1b", "--ranks", "2", "-m", "4", "--steps", "1", "--batch-size", "8", "--dp", "2"]
    cases = [  # (model, extra flags, the refusal's words)
        ("llama", ["--ep", "2", "--checkpoint-dir", str(tmp_path / "ck")], "is a dense model, it has no routed experts"),
    ]  # an unknown router and the divisibility refusals: the API's test below (the same check_ep)
    done = concurrently(lambda case: _console([*train, "--model", f"hf:{tmp_path / case[0]}.json", *case[1]]), cases)
    for (model, flags, words), result in zip(cases, done):
        assert result.returncode == 2, (flags, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and words in result.stderr, (flags, result.stderr)
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize("model, dp, ep, words", [
    ("mixtral", 3, 3, "--ep 3 does not divide the 4 routed experts of MixtralForCausalLM"),
    ("mixtral", 3, 2, "--ep 2 does not divide the 3 data-parallel ranks"),
    ("llama", 2, 2, "--ep 2: LlamaForCausalLM is a dense model"),
    ("olmoe", 2, 2, "--ep 2: OlmoeForCausalLM's router is not one pipesched knows"),
])
def test_the_api_refuses_before_any_group_is_used(model, dp, ep, words):
    from pipesched import hf
    from pipesched.runtime.comm.expert_mesh import ExpertMesh
    from pipesched.runtime.comm.mesh import PipelineMesh

    ids = torch.zeros(4 * dp, 16, dtype=torch.long)
    mesh = PipelineMesh(2, dp, 0, 0, None, None, (), experts=ExpertMesh(ep, 0, None, 0, 1, None))
    with pytest.raises(ConfigError) as refused:
        hf.pipeline(_configs()[model], pipesched.build_schedule("1f1b", 2, 4), optimizer=torch.optim.SGD,
                    sample_batch={"input_ids": ids, "labels": ids}, mesh=mesh)
    assert words in str(refused.value)


@pytest.fixture(scope="module")
def launched():  # the tests using it are slow: a 4-rank launch
    """One launch of 4 ranks (2 pipeline x 2 data-parallel) for every layout of :data:`RUNS`."""
    return launch([(label, kind, pipesched.build_schedule(name, 2, 4), sizes) for label, kind, name, sizes in RUNS],
                  BATCHES)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_three_sgd_steps_equal_the_model_in_one_process(launched):
    check_equal_to_one_process(launched, [label for label, *_ in RUNS], BATCHES, TOL)


@pytest.mark.slow
def test_each_rank_holds_half_the_experts_as_predicted(launched):
    model = make_model("mixtral", torch.float64)
    total = sum(p.numel() for p in model.parameters()) * 8
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n) * 8
    for label in ("mixtral 1f1b dp2 ep2", "mixtral zb-v dp_shard2 ep2"):
        held = launched[label]["bytes"]
        for rank in held:
            assert rank["measured"] == rank["predicted"], label
    # --dp 2 holds the whole model on each replica's two pipeline ranks; --ep 2 half its experts
    replica = launched["mixtral 1f1b dp2 ep2"]["bytes"][:2]  # global ranks 0, 1: pipeline ranks of replica 0
    assert sum(rank["measured"]["params"] for rank in replica) == total - experts // 2
    assert experts / total > 0.8  # the experts are most of Mixtral: well under --dp 2's bytes


@pytest.mark.parametrize("implementation", ["eager", "grouped_mm"])
def test_dispatch_and_combine_sum_as_the_family_sums(implementation):
    """At ep 1 (one process, its own EP group) the dispatched forward is the experts module's own, in
    transformers' eager loop and in its grouped kernel (whose orders of summing differ; each is
    kept): each expert computes the same rows, weighted alike, summed alike. The rows sit elsewhere
    in the expert's matmul (token by token, not choice by choice), and a CPU GEMM may round a row
    by where it sits in its block: a dot of 64 float32 terms, at most 64 eps of the largest output
    (Higham's bound; measured 2.8 eps)."""
    import torch.distributed as dist
    import transformers as tf

    from pipesched.expert_plans import ExpertPlan
    from pipesched.runtime.comm.expert_mesh import ExpertMesh
    from pipesched.runtime.sharding.expert_parallel import split_experts

    config = tf.MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2,
                              experts_implementation=implementation)
    torch.manual_seed(0)
    block = tf.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock(config)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.2)
    x = torch.randn(3, 5, 32)
    want = block(x)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = ExpertMesh(1, 0, dist.new_group([0]), 0, 1, None)
        split_experts({0: block}, mesh, ExpertPlan(("experts",), 4))
        got = block(x)
    finally:
        dist.destroy_process_group()
    torch.testing.assert_close(got, want, rtol=0, atol=64 * torch.finfo(torch.float32).eps * want.abs().max().item())
