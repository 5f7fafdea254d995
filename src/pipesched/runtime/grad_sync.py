"""Gradient reduction across ranks holding the same stages, overlapped with the rest of the pipeline.

Two reductions use it: data parallelism (the replicas' mean of each stage's gradients) and a
schedule of several model copies (DualPipe: the copies' sum, :mod:`~pipesched.runtime.copies`).
A stage's gradients are final once the last of its gradient-producing actions of the step (its
last ``W``, or its last ``B`` without split backward) has run. The plan says which action that is,
so right after it this rank flattens the stage's gradients into buckets and starts one
asynchronous all-reduce per bucket over its data-parallel group, while it goes on with the
actions of its other stages (and the pipeline's tail). Before the optimizer step it waits for
every bucket and writes the mean over the replicas back into ``.grad``: each replica's loss is
the mean over its own shard, so the mean of the replicas' gradients is the gradient of the mean
over the global batch, as one process would compute it on the whole batch.

``overlap=False`` starts every reduction only after the last action of the step (the baseline
the overlap is measured against, and the fallback where the ranks of a group would not start
their reductions in the same order: collectives must match one for one). Over gloo, gradients on a GPU are reduced through host copies
(as the pipeline's messages are).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from ..actions import Action

BUCKET_BYTES = 25 << 20  # DDP's default bucket size


def last_gradient_actions(actions: Sequence[Action]) -> dict[int, int]:
    """For each stage of this rank: the index of its last action that adds to its gradients."""
    last: dict[int, int] = {}
    for i, (stage, kind, _mb) in enumerate(actions):
        if kind in "IWB":
            last[stage] = i
    return last


class GradientSync:
    """Buckets and asynchronous all-reduces of one rank's stage gradients across ``group``.

    ``stages`` and the stages of ``actions`` are keyed alike on every rank of the group (the
    same key, the same modules), and every rank of the group must finish its stages in the same
    order when ``overlap`` is on. The sum is divided by ``divisor`` (the replicas: their mean).
    ``zero_missing``: a parameter without a gradient adds zeros instead of being left out (a model
    copy whose microbatches never reached it must still match the other copy's buckets)."""

    def __init__(
        self,
        stages: dict[int, nn.Module],
        actions: Sequence[Action],
        group: Any,
        divisor: int,
        overlap: bool = True,
        bucket_bytes: int = BUCKET_BYTES,
        zero_missing: bool = False,
    ) -> None:
        self.stages = stages
        self.group = group
        self.divisor = divisor
        self.overlap = overlap
        self.bucket_bytes = bucket_bytes
        self.zero_missing = zero_missing
        self.stage_done_at = {i: s for s, i in last_gradient_actions(actions).items()}
        self.on_host = dist.get_backend(group) == "gloo"
        self.pending: list[tuple[Any, torch.Tensor, list[torch.Tensor]]] = []

    def after_action(self, index: int) -> None:
        """Start reducing a stage's gradients when action ``index`` was its last one."""
        stage = self.stage_done_at.get(index)
        if stage is not None and self.overlap:
            self._start(stage)

    def finish(self) -> None:
        """Wait for every reduction of the step and leave the reduced gradients in ``.grad``."""
        if not self.overlap:
            for stage in sorted(self.stages):
                self._start(stage)
        for work, flat, grads in self.pending:
            work.wait()
            if self.divisor != 1:
                flat.div_(self.divisor)
            for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads)):
                grad.copy_(reduced)  # back onto the gradient's device
        self.pending = []

    def _start(self, stage: int) -> None:
        params = list(self.stages[stage].parameters())
        if self.zero_missing:
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params if p.grad is not None]
        for bucket in _buckets(grads, self.bucket_bytes):
            flat = _flatten_dense_tensors(bucket)
            if self.on_host:
                flat = flat.cpu()  # a no-op for CPU tensors
            work = dist.all_reduce(flat, group=self.group, async_op=True)
            self.pending.append((work, flat, bucket))


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
