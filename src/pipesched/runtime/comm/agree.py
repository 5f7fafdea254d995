"""The step's agreement: one mean loss, the first non-finite microbatch and the gradient norm on every rank.

Every microbatch's loss is computed on its pipeline's last stage; one all-reduce over the
pipeline gives every rank all of them and, with clipping, the squares of every gradient (each
weight counted once: see :class:`~.reduction.ReductionPlan.counted`, and :mod:`.grad_norm`), and with data-parallel
replicas one all-gather over the replicas turns their rows into the global batch's.

Without clipping nothing in the all-reduce waits for the gradients, so it is issued as soon as
this rank's part is known (:meth:`LossAgreement.issue`: at the step's start on a rank that
computes no loss, after its last loss on one that does) and runs while the backwards finish;
the step waits for it only after its program. With clipping it is issued after the program,
with the gradients' squares.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from .grad_norm import local_squares


class LossAgreement:
    """One step's agreement over the pipeline (and its replicas): issue once, then finish."""

    def __init__(self, microbatches: int, clipping: bool, mesh, device: torch.device) -> None:
        self.m = microbatches
        self.clipping = clipping
        self.mesh = mesh
        # gloo reduces host memory; NCCL device memory
        self.info_device = torch.device("cpu") if dist.get_backend() == "gloo" else device
        self.info: Optional[torch.Tensor] = None
        self.work: Any = None

    @property
    def early(self) -> bool:
        """Whether the all-reduce is issued while the program runs (nothing in it waits for gradients)."""
        return not self.clipping

    def issue(self, losses: Sequence[Optional[torch.Tensor]], counted: Sequence[nn.Parameter] = ()) -> None:
        """Start the all-reduce of this rank's losses (and, with clipping, its gradients' squares)."""
        info = torch.zeros(self.m + 1, dtype=torch.float64, device=self.info_device)
        present = [k for k, loss in enumerate(losses) if loss is not None]
        if present:
            values = torch.stack([losses[k] for k in present]).to(self.info_device, torch.float64)
            if len(present) == self.m:
                info[: self.m] = values
            else:
                info[present] = values
        if self.clipping:
            info[self.m] = local_squares(counted).to(info.device)
        self.info = info
        self.work = dist.all_reduce(info, group=self.mesh.pp_group, async_op=True)

    def finish(self) -> tuple[float, int, float, float]:
        """Mean loss, first non-finite microbatch (-1 if none) and its value, and (when clipping)
        the whole model's gradient norm (NaN otherwise), the same on every rank."""
        self.work.wait()
        row = self.info.tolist()
        self.info = self.work = None
        per_mb = row[: self.m]
        first_bad = next((k for k, value in enumerate(per_mb) if not math.isfinite(value)), -1)
        summary = [sum(per_mb) / self.m, first_bad + 1, per_mb[first_bad] if first_bad >= 0 else 0.0, row[self.m]]
        loss, bad_mb, bad_value, squares = _across_replicas(summary, self.mesh, self.m, self.info_device)
        return loss, int(bad_mb) - 1, bad_value, squares**0.5 if self.clipping else float("nan")


def _across_replicas(summary: list[float], mesh, m: int, device: torch.device) -> list[float]:
    """The replicas' (loss, bad microbatch + 1, its value, squares) as one: the mean loss
    over the global batch, the first bad microbatch in global numbering; the squares of the
    reduced gradients are the same on every replica."""
    if mesh.dp == 1:
        return summary
    info = torch.tensor(summary, dtype=torch.float64, device=device)
    rows = [torch.empty_like(info) for _ in range(mesh.dp)]
    dist.all_gather(rows, info, group=mesh.replicas_group)
    per_replica = [row.tolist() for row in rows]
    loss = sum(row[0] for row in per_replica) / mesh.dp
    bad = next(((d, row) for d, row in enumerate(per_replica) if row[1] > 0), None)
    if bad is None:
        return [loss, 0.0, 0.0, per_replica[0][3]]
    d, row = bad
    return [loss, d * m + row[1], row[2], per_replica[0][3]]
