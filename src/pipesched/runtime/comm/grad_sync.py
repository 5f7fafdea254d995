"""Bucketed asynchronous all-reduces of gradients, started one item at a time and awaited together.

:class:`~pipesched.runtime.comm.reduction.ReductionPlan` says which parameters are reduced with which
ranks and when; this module does it. An item's gradients are flattened into buckets (DDP's
default 25 MiB), each bucket all-reduced asynchronously over the item's process group while the
rank goes on with its actions; :meth:`Reducer.finish` waits for all of them, divides by the
replicas (each replica's loss is the mean over its own shard, so the mean of the replicas'
gradients is the gradient of the mean over the global batch) and writes the result back into
``.grad``. Over gloo, gradients on a GPU are reduced through host copies (as the pipeline's
messages are).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

BUCKET_BYTES = 25 << 20  # DDP's default bucket size


class Reducer:
    """The step's pending all-reduces; their sums are divided by ``divisor`` (the replicas)."""

    def __init__(self, divisor: int, bucket_bytes: int = BUCKET_BYTES) -> None:
        self.divisor = divisor
        self.bucket_bytes = bucket_bytes
        self.pending: list[tuple[Any, torch.Tensor, list[torch.Tensor]]] = []

    def start(self, params: Sequence[nn.Parameter], group: Any, zero_missing: bool) -> None:
        """Start reducing ``params``' gradients over ``group``; ``zero_missing``: a parameter
        without a gradient adds zeros instead of being left out."""
        if zero_missing:
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        grads = [getattr(p.grad, "_local_tensor", p.grad) for p in params if p.grad is not None]  # a shard's piece
        on_host = dist.get_backend(group) == "gloo"
        for bucket in _buckets(grads, self.bucket_bytes):
            flat = _flatten_dense_tensors(bucket)
            if on_host:
                flat = flat.cpu()  # a no-op for CPU tensors
            work = dist.all_reduce(flat, group=group, async_op=True)
            self.pending.append((work, flat, bucket))

    def finish(self) -> None:
        """Wait for every reduction started and leave the reduced gradients in ``.grad``."""
        for work, flat, grads in self.pending:
            work.wait()
            if self.divisor != 1:
                flat.div_(self.divisor)
            for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads)):
                grad.copy_(reduced)  # back onto the gradient's device
        self.pending = []


def _buckets(grads: list[torch.Tensor], limit: int) -> list[list[torch.Tensor]]:
    """Consecutive runs of same-dtype gradients of at most ``limit`` bytes (a larger one alone)."""
    buckets: list[list[torch.Tensor]] = []
    size = 0
    for g in grads:
        nbytes = g.numel() * g.element_size()
        if not buckets or size + nbytes > limit or buckets[-1][0].dtype != g.dtype:
            buckets.append([])
            size = 0
        buckets[-1].append(g)
        size += nbytes
    return buckets
