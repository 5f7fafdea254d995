"""Gradient clipping over sharded stages: every rank scales its own pieces of the gradients.

The whole model's norm comes from every rank's pieces, each element counted once
(:mod:`..comm.grad_norm`, the same rule as the metrics' norm). Clipping then scales every local
piece by torch's coefficient (``clip_grads_with_norm_``: ``max_norm / (norm + 1e-6)``, at most 1),
the copies of tied weights no optimizer steps included, so every gradient read by name is the
clipped one.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn


@torch.no_grad()
def clip_local(params: Iterable[nn.Parameter], max_norm: float, norm: float) -> None:
    """Scale every gradient piece of ``params`` as torch's ``clip_grads_with_norm_`` would the whole."""
    coefficient = min(max_norm / (norm + 1e-6), 1.0)
    for p in params:
        if p.grad is not None:
            getattr(p.grad, "_local_tensor", p.grad).mul_(coefficient)
