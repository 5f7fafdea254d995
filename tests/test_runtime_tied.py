"""Parameters tied across stages (an embedding and a head that are one weight) train exactly.

The model's first block is an embedding, its last a head whose weight is the embedding's
(``StagedModel(..., tied=(("0.weight", "5.weight"),))``). Under every placement the tie can take
(first and last stage on two ranks: 1f1b, interleaved; on one rank: the V of zb-v; in both model
copies: dualpipe) and with data-parallel replicas, the loss, every gradient and the parameters
after three SGD steps equal the unpipelined tied model's, and every rank's copy of the weight
stays bitwise equal.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from runtime_cases import assert_equal_to_reference, tied_run, train_tied_reference  # noqa: E402

import pipesched  # noqa: E402
from pipesched.runtime.launching.launch import spawn  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]


def _check(results: dict, batch: int) -> None:
    reference = train_tied_reference(batch)
    resumed = {k: results.pop(k) for k in list(results) if "resumed" in k}
    for label, got in resumed.items():  # the checkpoint keys the tied weight alike on every placement
        assert got["params"].keys() == reference["params"].keys(), label
        for name, want in reference["params"].items():
            assert torch.allclose(got["params"][name], want, atol=1e-6), (label, name)
    for label, got in results.items():
        assert got["copies_equal"], label
        assert got["optimized_once"], label
    assert_equal_to_reference(results, reference)


@pytest.mark.timeout(150)
def test_a_weight_tied_across_the_first_and_last_stage_trains_equal_to_unpipelined(tmp_path):
    # and a checkpoint of the V placement (one shared Parameter on rank 0) resumes under the loop
    # placement (a copy on each end's rank) and back, as if uninterrupted
    schedules = [(n, pipesched.build_schedule(n, 2, 4)) for n in ("1f1b", "zb-v", "interleaved-zb", "dualpipe")]
    resumes = [(("zb-v", "1f1b"), str(tmp_path / "v")), (("1f1b", "zb-v"), str(tmp_path / "loop"))]
    results = spawn(tied_run, 2, (schedules, 1, 8, resumes), timeout_s=60)[0]
    # the tied gradient is the embedding's sum plus the head's, in microbatch order, under every
    # placement (pipesched.runtime.engine.tied_sums): the same weights, bit for bit
    for label in ("zb-v", "interleaved-zb"):
        for name, want in results["1f1b"]["params"].items():
            assert torch.equal(results[label]["params"][name], want), (label, name)
    _check(results, 8)


@pytest.mark.timeout(150)
def test_tied_weights_with_data_parallel_replicas():
    # zb-v shares the weight on rank 0; dualpipe's copies sum it across ranks with the replicas' mean
    schedules = [(n, pipesched.build_schedule(n, 2, 2)) for n in ("zb-v", "dualpipe")]
    _check(spawn(tied_run, 4, (schedules, 2, 8), timeout_s=90)[0], 8)


def test_a_weight_held_on_two_stages_of_a_rank_is_summed_per_stage_then_added():
    """A V schedule interleaves the head's and the embedding's backwards on rank 0; the weight's
    gradient is still (embedding's terms in microbatch order) + (head's), as two ranks sum it."""
    from types import SimpleNamespace

    from torch import nn

    from pipesched.runtime.engine.tied_sums import TiedSums

    emb, head = nn.Embedding(5, 3, dtype=torch.float64), nn.Linear(3, 5, bias=False, dtype=torch.float64)
    head.weight = emb.weight
    param = emb.weight
    sums = TiedSums({0: SimpleNamespace(blocks={"0": emb}), 3: SimpleNamespace(blocks={"5": head})},
                    [("0.weight", "5.weight")])
    terms = {s: [torch.randn(5, 3, dtype=torch.float64) for _ in range(3)] for s in (0, 3)}

    def backward(s: int, k: int) -> None:
        with sums.stage(s):
            param.grad = terms[s][k].clone() if param.grad is None else param.grad + terms[s][k]

    backward(0, 0)  # a step cut short by an error: forgotten
    sums.clear()
    for s, k in [(3, 0), (0, 0), (3, 1), (3, 2), (0, 1), (0, 2)]:
        backward(s, k)
        assert param.grad is None  # outside a stage's backward the shares are apart
    sums.reduced(3)
    assert param.grad is None  # the embedding's stage is not done yet
    sums.reduced(0)
    want = ((terms[0][0] + terms[0][1]) + terms[0][2]) + ((terms[3][0] + terms[3][1]) + terms[3][2])
    assert torch.equal(param.grad, want)
