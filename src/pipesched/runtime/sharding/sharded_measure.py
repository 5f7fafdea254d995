"""Bytes a rank actually holds for a sharded stage: the measurement the prediction of
:mod:`pipesched.sharded_bytes` promises to match.

Each tensor is counted by the storage behind its local piece (a DTensor's ``_local_tensor``),
each storage once: FSDP keeps a parameter in a padded buffer of its own and its reduced gradients
as views of one padded buffer per group, which is what the rank's memory holds.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn


def _local(t: torch.Tensor) -> torch.Tensor:
    return getattr(t, "_local_tensor", t)


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (their local pieces)."""
    seen: dict[int, int] = {}
    for t in tensors:
        storage = _local(t).untyped_storage()
        seen[storage.data_ptr() or id(storage)] = storage.nbytes()
    return sum(seen.values())


def held_bytes(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """``params``, ``grads`` and ``optimizer`` bytes this rank holds for ``module`` (sharded
    parameters, their gradients, the optimizer's state tensors)."""
    params = list(module.parameters())
    state = [v for p in params for v in optimizer.state.get(p, {}).values() if isinstance(v, torch.Tensor)]
    return {"params": storage_bytes(params),
            "grads": storage_bytes(p.grad for p in params if p.grad is not None),
            "optimizer": storage_bytes(state)}


def gathered_bytes(module: nn.Module, grads: bool = False) -> int:
    """Bytes of ``module``'s parameters as registered now (between ``unshard`` and ``reshard``
    the gathered ones, each rank's tensor-parallel piece), each parameter once; with ``grads``,
    of their gradients instead (before ``reduce_grad``: the unsharded ones accumulated so far)."""
    tensors = (p.grad if grads else p for p in module.parameters())
    return sum(_local(t).numel() * t.element_size() for t in tensors if t is not None)


def optimizer_slots(optimizer: torch.optim.Optimizer) -> int:
    """State tensors the optimizer keeps per parameter: Adam's and AdamW's two moments, SGD's
    momentum buffer where it has momentum (what :func:`~pipesched.sharded_bytes.rank_state_bytes`
    calls ``slots``)."""
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return 2
    if isinstance(optimizer, torch.optim.SGD):
        return int(any(group.get("momentum", 0) for group in optimizer.param_groups))
    raise ValueError(f"no state size known for {type(optimizer).__name__}")
