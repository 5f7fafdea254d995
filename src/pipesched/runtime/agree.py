"""The step's agreement: one mean loss, the first non-finite microbatch and the gradient norm on every rank.

Every microbatch's loss is computed on its pipeline's last stage; one all-reduce over the
pipeline gives every rank all of them and, with clipping, the squares of every gradient (each
weight counted once: see :class:`~.reduction.ReductionPlan.counted`), and with data-parallel
replicas one all-gather over the replicas turns their rows into the global batch's.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn


def agree(losses: Sequence[Optional[torch.Tensor]], counted: Sequence[nn.Parameter], clipping: bool,
          mesh, device: torch.device) -> tuple[float, int, float, float]:
    """Mean loss, first non-finite microbatch (-1 if none) and its value, and (when clipping)
    the whole model's gradient norm (NaN otherwise), the same on every rank."""
    m = len(losses)
    # gloo reduces host memory; NCCL device memory
    info = torch.zeros(m + 1, dtype=torch.float64, device="cpu" if dist.get_backend() == "gloo" else device)
    for k, loss in enumerate(losses):
        if loss is not None:
            info[k] = loss.double()
    if clipping:
        grads = [p.grad for p in counted if p.grad is not None]
        if grads:
            info[m] = sum(g.detach().double().pow(2).sum() for g in grads).to(info.device)
    dist.all_reduce(info, group=mesh.pp_group)
    per_mb = info[:m]
    bad = (~torch.isfinite(per_mb)).nonzero()
    first_bad = int(bad[0, 0]) if bad.numel() else -1
    summary = info.new_tensor([float(per_mb.mean()), first_bad + 1,
                               float(per_mb[first_bad]) if first_bad >= 0 else 0.0, float(info[m])])
    loss, bad_mb, bad_value, squares = _across_replicas(summary, mesh, m)
    return loss, int(bad_mb) - 1, bad_value, squares**0.5 if clipping else float("nan")


def _across_replicas(info: torch.Tensor, mesh, m: int) -> list[float]:
    """The replicas' (loss, bad microbatch + 1, its value, squares) as one: the mean loss
    over the global batch, the first bad microbatch in global numbering; the squares of the
    reduced gradients are the same on every replica."""
    if mesh.dp == 1:
        return info.tolist()
    rows = [torch.empty_like(info) for _ in range(mesh.dp)]
    dist.all_gather(rows, info, group=mesh.dp_group)
    per_replica = [row.tolist() for row in rows]
    loss = sum(row[0] for row in per_replica) / mesh.dp
    bad = next(((d, row) for d, row in enumerate(per_replica) if row[1] > 0), None)
    if bad is None:
        return [loss, 0.0, 0.0, per_replica[0][3]]
    d, row = bad
    return [loss, d * m + row[1], row[2], per_replica[0][3]]
