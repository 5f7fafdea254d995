"""Split backward without recomputation and without walking the autograd graph.

Every ``nn.Linear`` of a stage is routed through :class:`_DeferrableLinear`. Its backward always
returns the input gradient; while a :class:`WeightGradStash` is collecting (an ``I`` action), it
stashes ``(input, output gradient)`` instead of computing the weight gradient, and ``W`` later
computes ``dW = g^T x`` and ``db = sum(g)`` with one matmul per Linear. Outside collection (a full
``B`` action) it returns the weight gradients at once, as ordinary autograd would. Both compute
the product as autograd's own backward of the module does (:func:`weight_grad`), and ``W`` adds it
to ``.grad`` as autograd accumulates, so a weight's gradient has the same bits under a split, a
fused and a plain backward: a seed trains the same weights under every schedule.

A module that is a Linear with its weight stored transposed (``y = x W + b``, ``W`` of shape
``(in, out)``: transformers' ``Conv1D``, GPT-2's projections) is deferred the same way once its
class is registered with :func:`register_transposed_linear` (this module imports no model library).

Other parameters (LayerNorm, embeddings) get their gradients during ``I``: they are cheap.
The autograd graph is freed at the end of ``I``; only the stashed tensors live on until ``W``.

Under ``torch.autocast`` the Linear computes as autocast would (inputs, weight and bias cast to
the autocast dtype) and keeps the cast copies for its backward, which therefore runs in that
dtype too; the weight gradients are accumulated into the fp32 ``.grad`` (as autograd does for an
autocast Linear).
"""

from __future__ import annotations

import types
from contextlib import nullcontext
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

Entry = tuple[nn.Linear, torch.Tensor, torch.Tensor]

TRANSPOSED_LINEARS: set[type] = set()  # classes computing x @ weight + bias, weight (in, out)


def register_transposed_linear(cls: type) -> None:
    """Defer the weight gradients of ``cls`` too: a module with ``weight`` (in, out) and ``bias``
    computing ``x @ weight + bias``."""
    TRANSPOSED_LINEARS.add(cls)


class WeightGradStash:
    """Where deferred Linear backwards put their (module, input, output gradient) triples.

    ``hold``, when set, is called on each stashed tensor as it is stashed, and what it returns
    is kept in ``holders`` (a memory meter counts the stash this way)."""

    def __init__(self, hold: Optional[Callable[[torch.Tensor], object]] = None) -> None:
        self.collecting: Optional[list[Entry]] = None
        self.hold = hold
        self.holders: list = []

    def __deepcopy__(self, memo: dict) -> "WeightGradStash":
        """A copy of a prepared module (shape inference copies blocks to ``meta``) routes its
        Linears to the same stash: the stash is the runtime's, not the module's state."""
        return self


class _DeferrableLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, module, stash):
        if module._pipesched_transposed:
            weight = weight.t()
        device_type = x.device.type
        autocasting = torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)
        if autocasting:  # meta (shape inference) has no autocast
            dtype = torch.get_autocast_dtype(device_type)
            x, weight = x.to(dtype), weight.to(dtype)
            bias = bias.to(dtype) if bias is not None else None
        ctx.save_for_backward(x, weight)
        ctx.module = module
        ctx.stash = stash
        ctx.has_bias = bias is not None
        with torch.autocast(device_type, enabled=False) if autocasting else nullcontext():
            return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        grad_out = grad_out.to(weight.dtype)
        grad_x = grad_out.matmul(weight) if ctx.needs_input_grad[0] else None
        pending = ctx.stash.collecting
        if pending is not None:
            entry = (ctx.module, x.detach(), grad_out.detach())
            pending.append(entry)
            if ctx.stash.hold is not None:
                ctx.stash.holders.extend((ctx.stash.hold(entry[1]), ctx.stash.hold(entry[2])))
            return grad_x, None, None, None, None
        g2 = grad_out.reshape(-1, grad_out.shape[-1])
        grad_w = weight_grad(ctx.module, x.reshape(-1, x.shape[-1]), g2)
        grad_b = g2.sum(0) if ctx.has_bias else None
        return grad_x, grad_w, grad_b, None, None


def weight_grad(module: nn.Module, x2: torch.Tensor, g2: torch.Tensor) -> torch.Tensor:
    """One microbatch's weight gradient of ``module`` from its input and output gradient (rows):
    the same ``mm`` autograd's ``addmm`` backward runs for the module's own forward, so the
    fused ``B``, the ``W`` after an ``I`` and a schedule without the split (plain autograd) give
    the same bits: ``g^T x`` for a Linear (its weight is ``addmm``'s transposed ``mat2``),
    ``x^T g`` for a transposed Linear (its weight is ``mat2`` itself, ``(in, out)``)."""
    if module._pipesched_transposed:
        return x2.t().mm(g2)
    return g2.t().mm(x2)


def _deferrable_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return _DeferrableLinear.apply(x, self.weight, self.bias, self, self._pipesched_stash)


def make_weight_grads_deferrable(module: nn.Module, stash: WeightGradStash) -> int:
    """Route every ``nn.Linear`` (and registered transposed Linear) in ``module`` through the
    deferrable function; returns how many.

    Parameter names and state dicts are unchanged (only the instances' ``forward`` is rebound).
    """
    count = 0
    for sub in module.modules():
        transposed = isinstance(sub, tuple(TRANSPOSED_LINEARS))
        if isinstance(sub, nn.Linear) or transposed:
            sub._pipesched_transposed = transposed
            sub._pipesched_stash = stash
            sub.forward = types.MethodType(_deferrable_forward, sub)
            count += 1
    return count


@torch.no_grad()
def apply_weight_grads(entries: list[Entry]) -> None:
    """The ``W`` action: accumulate the deferred weight and bias gradients into ``.grad``.

    Runs without autograd recording: the stashed input requires grad, so a recorded ``g^T x``
    would give each ``.grad`` a history (an ``MmBackward0``) that keeps every microbatch's output
    gradient alive until the next ``zero_grad`` -- right values, but the split schedules then
    held 2-3x the memory they promise."""
    for module, x, grad_out in entries:
        g2 = grad_out.reshape(-1, grad_out.shape[-1])
        weight = module.weight
        if weight.requires_grad:  # a frozen Linear gets no gradient, as with ordinary autograd
            grad = weight_grad(module, x.reshape(-1, x.shape[-1]), g2)
            if weight.grad is None:
                weight.grad = grad.to(weight.dtype)  # from the autocast dtype, as autograd casts it
            else:  # the product, then the sum, as autograd accumulates (a fused addmm_ rounds once, not twice)
                weight.grad.add_(grad)
        bias = module.bias
        if bias is not None and bias.requires_grad:
            if bias.grad is None:
                bias.grad = g2.sum(0).to(bias.dtype)
            else:
                bias.grad.add_(g2.sum(0))
