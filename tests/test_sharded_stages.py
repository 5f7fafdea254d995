"""Sharded stages (FSDP2 and tensor parallelism inside a stage) against the unsharded model.

One launch of 4 gloo processes (tests/sharded_cases.py) runs every case: the built-in gpt, a
tiny Hugging Face Llama and GPT-2 (tied head) in fp32, each the whole model as one stage trained
by 2 microbatches a step, with gradient sync off for every backward and one ``reduce_grad`` at
the end of the step, at pp 2 x dp_shard 2, pp 2 x tp 2, dp_shard 2 x tp 2 and (GPT-2) HSDP
dp_replicate 2 x dp_shard 2; at dp_shard 2 x tp 2 also the families whose q/k norms sit between
the split projections (``QK_NORM_MODELS``), those that fuse or rename their projections
(``FUSED_MODELS``), and DeepSeek-V3 and Qwen2-MoE (their families' shrunk configs). At pp 2 each pipeline position runs its own copy of the stage on its own device mesh.

Tolerances. The sharded step computes the same products as the reference and only sums them in
another order: per microbatch and data-parallel rank, then across ranks (and, under tensor
parallelism, the row-wise layers' partial products across ``tp``). Reordering a sum of ``n``
fp32 terms changes it by at most ``n * u * sum|terms|`` (u = 2**-24, unit roundoff). A weight
gradient here sums at most one term per token of the step (8 samples x 16 tokens), except the
q/k norms' between the split projections (``QK_NORM_MODELS``): a norm of one head's width
(Qwen3, Gemma 3) sums one term per token and head, 8 samples x 12 tokens x 4 heads (``TERMS``),
each ``tp`` rank its own heads; OLMo 2's, over the whole projection, sums each token's 64 squares
in one piece per ``tp`` rank, a reordering in the forward that moves the gradients by at most
``64 u`` relatively, and 96 terms per gradient: under ``TERMS`` too. At random initialisation
these terms do not cancel much, so ``sum|terms|`` is of the order of the largest gradient, below
0.4 (checked): ``384 * 6e-8 * 0.4 = 9.2e-6`` bounds the difference, under the issue's 1e-5
(measured: at most 3e-7). SGD (lr 0.1) moves a weight by lr x
its gradient, so the weights differ by lr x that plus a rounding of each update. The split
backward (``I`` then ``W``) computes each weight gradient with the same matmul as the fused
``B`` and only adds the second microbatch's product in another way (``addmm_`` into ``.grad``),
a reordering of one sum of at most half the terms.

Routing (Qwen2-MoE, DeepSeek-V3, whose routed experts stay whole on every ``tp`` rank): the
``tp`` ranks of a token compute its router logits bit for bit alike (the row-wise all-reduce hands
each the same sum), so they route it alike. Against the reference a logit moves by the router
row's 1-norm (about 64 x 0.02 x 0.8 = 1.0 at initialisation: below ``ROUTER_NORM``) times the
hidden state's rounding difference, which is of the gradients' order (under the 1e-5 bound); a
token goes to another expert only if the gap between the last logit chosen and the first left out
is smaller than that, which would show as a gross error, not a rounding one. The smallest gap
over every token of the reference run (``routing_margin``) is checked to exceed
``ROUTER_NORM x GRAD_TOLERANCE`` (measured about 2e-4).

Tensor parallelism's guard (runtime/sharding/tp_guard.py) finds no partial gradient after the
first step of any case (fused and split), and refuses Qwen3 under Llama's plan (its per-head q/k
norms between the split projections) on every rank, once, at dp_shard 2 x tp 2.
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from pipesched.sharded_bytes import rank_state_bytes  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

U = 2.0 ** -24
TERMS = 8 * 12 * 4
LARGEST_GRAD = 0.4
GRAD_TOLERANCE = 1e-5
assert TERMS * U * LARGEST_GRAD < GRAD_TOLERANCE
SPLIT_TOLERANCE = TERMS // 2 * U * LARGEST_GRAD
ROUTER_NORM = 2.0

MODELS = ["gpt", "llama", "gpt2"]
# the families with q/k norms between the split projections (model_plans.OVERRIDES), one per style
# of norm and Qwen3-MoE (experts whole): the norms' weight gradients summed over tp
QK_NORM_MODELS = ["qwen3", "qwen3-moe", "gemma3", "cohere-qk", "olmo2"]
# the families that fuse or rename their projections; Falcon's multi-query layout and Phi-3 with fewer
# key-value heads split only their MLP
FUSED_MODELS = ["gpt-neox", "falcon", "falcon-grouped", "phi3", "phi3-gqa"]
# every case (benchmarks/sharded_vs_torch.py --check runs them all); the suite runs the ones the
# whole pipelines do not (tests/test_sharded_pipelines.py trains every schedule family at
# pp 2 x dp_shard 2 and pp 2 x tp 2 through the runtime: the gpt, Llama and tied GPT-2)
ALL_CASES = {
    "pp 2 x dp_shard 2": (dict(pp=2, dp_shard=2), MODELS),
    "pp 2 x tp 2": (dict(pp=2, tp=2), MODELS),
    "dp_shard 2 x tp 2": (dict(pp=1, dp_shard=2, tp=2), MODELS + QK_NORM_MODELS + FUSED_MODELS + ["deepseek-v3", "qwen2-moe"]),
    "dp_replicate 2 x dp_shard 2": (dict(pp=1, dp_replicate=2, dp_shard=2), ["gpt2"]),
    "dp_shard 2 x tp 2, resharded after forward": (dict(pp=1, dp_shard=2, tp=2, reshard_after_forward=True), ["gpt"]),
}
# 8 ranks, outside the suite's 4-process launch (benchmarks/sharded_vs_torch.py --check runs them
# in a launch of their own): HSDP x tp over the fused and interleaved styles
EIGHT_RANK_CASES = {
    "dp_replicate 2 x dp_shard 2 x tp 2": (dict(pp=1, dp_replicate=2, dp_shard=2, tp=2),
                                           ["gpt2", "phi3", "gpt-neox", "falcon-grouped"]),
}
CASES = {label: case for label, case in ALL_CASES.items() if not label.startswith("pp 2")}
RUNS = [(label, kind) for label, (_, kinds) in CASES.items() for kind in kinds]


@pytest.fixture(scope="module")
def ranks():
    """Every rank's results of every case, from one launch."""
    from sharded_cases import suite

    from pipesched.runtime.launching.launch import spawn

    return spawn(suite, 4, CASES, timeout_s=280)


def layout_of(label: str):
    """The ParallelLayout of case ``label``."""
    from pipesched.parallel_layout import runtime_layout

    sizes = {**ALL_CASES, **EIGHT_RANK_CASES}[label][0]
    return runtime_layout(**{k: v for k, v in sizes.items() if k != "reshard_after_forward"})


def each_rank(ranks, label, kind):
    return [(ranks[r]["cases"][label]["coordinates"], ranks[r]["cases"][label][kind]) for r in sorted(ranks)]


def test_a_layout_without_shards_places_ranks_as_the_existing_data_parallel_mesh(ranks):
    for r in ranks:
        assert ranks[r]["placements"]["layout"] == ranks[r]["placements"]["existing"]


def test_shards_of_a_pipeline_position_form_its_device_mesh(ranks):
    # runtime order dp_shard, pp: rank g is pipeline rank g % 2 of data shard g // 2
    for r in ranks:
        pp_rank, shard_rank, device_mesh, dp_group = ranks[r]["placements"]["sharded"]
        assert (pp_rank, shard_rank) == (r % 2, r // 2)
        assert device_mesh == [[[r % 2], [r % 2 + 2]]]  # (dp_replicate, dp_shard, tp) = (1, 2, 1)
        assert dp_group is None  # FSDP reduces: the runtime's own all-reduce must not


@pytest.mark.parametrize("label, kind", RUNS)
def test_gradients_and_sgd_weights_equal_the_unsharded_model(ranks, label, kind):
    for _, case in each_rank(ranks, label, kind):
        assert case["largest_grad"] < LARGEST_GRAD  # the premise of the tolerance (module doc)
        if case["routing_margin"] is not None:  # no token near a tie between experts (module doc)
            assert case["routing_margin"] > ROUTER_NORM * GRAD_TOLERANCE
        assert case["grad_error"] < GRAD_TOLERANCE
        assert case["weight_error"] < 0.1 * GRAD_TOLERANCE + 2 * U  # lr x gradient error, 2 rounded updates


@pytest.mark.parametrize("label, kind", RUNS)
def test_the_split_backward_equals_the_fused_one(ranks, label, kind):
    for _, case in each_rank(ranks, label, kind):
        assert case["deferred"] > 0  # the I really left weight gradients to the W
        assert case["split_vs_fused"] <= SPLIT_TOLERANCE


@pytest.mark.parametrize("kind", ["phi3", "gpt2"])
def test_a_checkpoint_of_interleaved_pieces_loads_into_the_sharded_and_the_whole_model(ranks, kind):
    # Phi-3's q|k|v and GPT-2's c_attn, each rank the same slice of each part: DCP places no
    # such piece, so checkpoints write them gathered along tp; weights and AdamW moments come back bitwise
    for _, case in each_rank(ranks, "dp_shard 2 x tp 2", "checkpoint"):
        assert case[kind] == 0.0


@pytest.mark.parametrize("label, kind", RUNS)
def test_held_bytes_are_the_predicted_ones(ranks, label, kind):
    layout = layout_of(label)
    for (tp_rank, shard_rank), case in each_rank(ranks, label, kind):
        predicted = rank_state_bytes(case["specs"], layout, tp_rank, shard_rank, slots=2)  # AdamW
        measured = case["bytes"]
        for what, figure in (("params", predicted.params), ("grads", predicted.grads),
                             ("optimizer", predicted.optimizer)):
            assert measured[what] == pytest.approx(figure, rel=0.02), what
        assert case["gathered_bytes"] == pytest.approx(predicted.gathered_params, rel=0.02)
        assert case["unsharded_grad_bytes"] == pytest.approx(predicted.unsharded_grads, rel=0.02)


@pytest.mark.parametrize("label, kind", RUNS)
def test_the_tp_guard_finds_no_partial_gradient_under_a_correct_plan(ranks, label, kind):
    # every gradient tensor parallelism leaves whole agrees across tp after the first step, fused and split
    for _, case in each_rank(ranks, label, kind):
        assert case["partial"] == []


def test_the_tp_guard_refuses_a_plan_that_leaves_per_head_norms_between_the_splits(ranks):
    """Qwen3 under Llama's plan: each of its 4 layers' q_norm and k_norm, named in one line, the
    same on every rank; the tp ranks' gradients of each differ by more than half the gradient,
    the premise of the guard's chance of missing one (tp_guard.py: 0.1 ** 16)."""
    refusing = [label for label, (sizes, _) in CASES.items()
                if sizes.get("tp", 1) > 1 and not sizes.get("reshard_after_forward")]
    assert refusing  # (sharded_cases.run_case: once, at a tp layout without resharding)
    for label in refusing:
        refused = [ranks[r]["cases"][label]["refused"] for r in sorted(ranks)]
        said = {case["said"] for case in refused}
        assert len(said) == 1, said
        line = said.pop()
        named = "(self_attn.k_norm.weight x4, self_attn.q_norm.weight x4;"
        assert line.startswith("tensor parallelism (tp=2): 8 parameters the plan leaves replicated got different "
                               f"gradients on the tp ranks {named}"), line
        assert "stopped before any weight changed" in line and "\n" not in line
        for case in refused:
            assert len(case["apart"]) == 8 and min(case["apart"].values()) > 0.5, case["apart"]


def test_a_head_count_tp_does_not_divide_is_refused_before_anything_is_split():
    from pipesched.errors import ConfigError
    from pipesched.runtime.sharding.tp_plans import GPT_PLAN, apply_tp
    from pipesched.training.models import TransformerBlock

    class TwoWays:  # a tp mesh of 2, as far as the refusal reads it
        def size(self) -> int:
            return 2

    block = TransformerBlock(12, 3)
    with pytest.raises(ConfigError, match="tp=2 does not divide the 3 heads of attn"):
        apply_tp(block, GPT_PLAN, TwoWays())
    assert block.attn.heads == 3 and not hasattr(block.attn.qkv.weight, "placements")
