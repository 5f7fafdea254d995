"""Guarded weights: after every optimizer step, a NaN or infinite parameter stops the run.

A finite loss does not make a finite update (a NaN learning rate, an overflowing Adam moment):
without this check a run could end "successfully" and save weights that are all NaN. The check
reads every parameter once per step (one sum each, a single host sync; about 0.3 ms per 2M
parameters on one CPU thread), so the weights that checkpoints and ``--save-params``
write are always finite.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch
import torch.distributed as dist

from ..errors import RunFailure


class NonFiniteWeights(RunFailure):
    """An optimizer step left a parameter NaN or infinite (the run stops; nothing of it is saved)."""

    def __init__(self, step: int, name: str) -> None:
        super().__init__(
            f"step {step}: the optimizer step made parameter {name} non-finite (NaN or inf); "
            "stopped before saving anything of it (lower --lr, or clip with --clip-grad-norm)"
        )
        self.step = step
        self.name = name


def first_nonfinite(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Optional[str]:
    """The name of the first tensor holding a NaN or an infinity, in the order given; None if all
    are finite. The sum of finite numbers is finite (unless it overflows), so one fused sum per
    tensor and a single host sync clear the usual step; only a non-finite sum looks closer: a
    tensor's minimum and maximum are NaN if it holds a NaN and infinite if it holds an infinity
    (no temporary of the tensor's size, as ``isfinite(t).all()`` would make)."""
    named = [(name, t.detach()) for name, t in named_tensors if t.numel()]
    if not named:
        return None
    if bool(torch.stack([t.sum(dtype=torch.float32) for _, t in named]).isfinite().all()):
        return None
    extremes = torch.stack([torch.stack(torch.aminmax(t)).float() for _, t in named]).cpu()
    bad = (~torch.isfinite(extremes).all(dim=1)).nonzero()
    return named[int(bad[0, 0])][0] if bad.numel() else None


def check_weights(named_parameters: Iterable[tuple[str, torch.Tensor]], step: int, group: Any,
                  device: torch.device) -> None:
    """Stop every rank of ``group`` when the optimizer step left a parameter non-finite, naming
    the step (counted from 1) and the model's first such parameter: one flag all-reduced per
    step, the names gathered only on failure (collective)."""
    bad = first_nonfinite(named_parameters)
    flag = torch.tensor([bad is not None], dtype=torch.int32,
                        device="cpu" if dist.get_backend(group) == "gloo" else device)
    dist.all_reduce(flag, group=group)
    if flag.item():
        names = [None] * dist.get_world_size(group)
        dist.all_gather_object(names, bad, group=group)
        raise NonFiniteWeights(step, min((n for n in names if n), key=block_order))


def block_order(name: str) -> tuple[int, str]:
    """Sort key of an unpipelined name (``"3.fc1.weight"``): by block, then name."""
    head, _, rest = name.partition(".")
    return (int(head), rest) if head.isdigit() else (1 << 30, name)
