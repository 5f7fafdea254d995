"""Split backward: I gives the input gradient and skips every Linear's weight-gradient matmul;
W computes exactly those, so that I then W equals one ordinary backward."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from pipesched.runtime.engine.split_backward import (  # noqa: E402
    WeightGradStash,
    apply_weight_grads,
    make_weight_grads_deferrable,
)
from pipesched.training.models import TransformerBlock  # noqa: E402

pytestmark = pytest.mark.torch
MATMULS = {"mm", "addmm", "bmm", "matmul"}


class CountMatmuls(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.overloadpacket.__name__ in MATMULS
        return func(*args, **(kwargs or {}))


def input_gradient(output, grad, stash: WeightGradStash) -> list:
    """The I action: backward with the stash collecting; returns what W needs."""
    entries: list = []
    stash.collecting = entries
    try:
        torch.autograd.backward(output, grad)
    finally:
        stash.collecting = None
    return entries


def stages():
    torch.manual_seed(0)
    frozen = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))
    frozen[1].requires_grad_(False)
    return {
        "transformer block": (TransformerBlock(16, 2), torch.randn(3, 5, 16)),
        "ends with a Linear": (nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 16)), torch.randn(4, 16)),
        "frozen Linear": (frozen, torch.randn(4, 8)),
    }


@pytest.mark.parametrize("name", list(stages()))
def test_input_then_weight_gradients_equal_one_ordinary_backward(name):
    plain, x = stages()[name]
    split_stage = copy.deepcopy(plain)
    stash = WeightGradStash()
    linears = make_weight_grads_deferrable(split_stage, stash)
    g = torch.randn_like(plain(x))

    x_plain = x.clone().requires_grad_()
    plain(x_plain).backward(g)

    x_split = x.clone().requires_grad_()
    entries = input_gradient(split_stage(x_split), g, stash)
    assert len(entries) == linears
    for module, _, _ in entries:  # I left every Linear weight gradient to W
        assert module.weight.grad is None
    apply_weight_grads(entries)

    torch.testing.assert_close(x_split.grad, x_plain.grad)
    for (pname, p), q in zip(plain.named_parameters(), split_stage.parameters()):
        assert (p.grad is None) == (q.grad is None), pname
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, msg=pname)


def test_input_gradient_skips_the_weight_matmuls_that_w_then_runs():
    block, x = stages()["transformer block"]
    reference = copy.deepcopy(block)
    stash = WeightGradStash()
    linears = make_weight_grads_deferrable(block, stash)
    x = x.requires_grad_()
    g = torch.randn_like(x)

    y = reference(x)
    with CountMatmuls() as full:
        y.backward(g)
    y = block(x)
    with CountMatmuls() as input_only:
        entries = input_gradient(y, g, stash)
    with CountMatmuls() as weights:
        apply_weight_grads(entries)

    assert weights.count == linears
    assert input_only.count == full.count - linears


def test_other_parameters_get_their_gradients_in_i():
    torch.manual_seed(0)
    stage = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8))
    stash = WeightGradStash()
    make_weight_grads_deferrable(stage, stash)
    entries = input_gradient(stage(torch.tensor([[1, 2, 3]])).sum(), None, stash)
    assert stage[0].weight.grad is not None
    assert stage[1].weight.grad is None and len(entries) == 1


@pytest.mark.parametrize("name", list(stages()))
def test_weight_gradients_carry_no_autograd_history(name):
    """A gradient with a grad_fn keeps its whole history (every microbatch's output gradient)
    alive until the next zero_grad: W must leave plain tensors, after accumulation too."""
    block, x = stages()[name]
    stash = WeightGradStash()
    make_weight_grads_deferrable(block, stash)
    for _ in range(2):  # the second W accumulates into an existing .grad
        x_mb = x.clone().requires_grad_()
        y = block(x_mb)
        apply_weight_grads(input_gradient(y, torch.randn_like(y), stash))
    for pname, p in block.named_parameters():
        if p.grad is not None:
            assert p.grad.grad_fn is None and not p.grad.requires_grad, pname
