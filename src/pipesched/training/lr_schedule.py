"""The learning rate of every step (``--lr-schedule``, ``--warmup``, ``--min-lr``) and the weight
decay's parameter groups (``--weight-decay``).

The rate is a closed form of the step index alone: a linear warm-up over ``warmup`` steps (step
``s < warmup`` trains at ``lr * (s + 1) / (warmup + 1)``, nanoGPT's and torchtitan's ramp, so no
step trains at 0), then from ``lr`` at step ``warmup`` a cosine, linear or no decay that reaches
``min_lr`` at the run's last step. Because it depends on the step and nothing else, a run resumed
from a checkpoint after step ``k`` continues with exactly the rates the uninterrupted run used,
whatever schedule or rank count either ran under; the checkpoint needs no scheduler state.

torch's :class:`~torch.optim.lr_scheduler.LambdaLR` applies it (:func:`attach`). Weight decay goes
to matrices only (Linear and Embedding weights); biases and norm weights, the 1-D parameters, get
none: the split the transformers Trainer makes (by module type and name) for the models
pipesched trains, and nanoGPT's rule. Importing this module does not import torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Optional

if TYPE_CHECKING:
    import torch

SCHEDULES = ("constant", "cosine", "linear")


@dataclass(frozen=True)
class LRSchedule:
    """Peak rate ``lr``, decayed by ``kind`` to ``min_lr`` over a run of ``steps`` after ``warmup``."""

    lr: float
    steps: int
    kind: str = "constant"
    warmup: int = 0
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"unknown learning-rate schedule {self.kind!r}: use one of {', '.join(SCHEDULES)}")

    def rate(self, step: int) -> float:
        """The learning rate step ``step`` (0-based) trains with."""
        if step < self.warmup:
            return self.lr * (step + 1) / (self.warmup + 1)
        if self.kind == "constant":
            return self.lr
        span = self.steps - 1 - self.warmup  # from the peak (step ``warmup``) to ``min_lr`` (the last step)
        progress = min(1.0, (step - self.warmup) / span) if span > 0 else 0.0  # one step after the warm-up: the peak
        shape = 0.5 * (1.0 + math.cos(math.pi * progress)) if self.kind == "cosine" else 1.0 - progress
        return self.min_lr + (self.lr - self.min_lr) * shape

    def factor(self, step: int) -> float:
        """:meth:`rate` as LambdaLR's multiplier of the peak rate."""
        return self.rate(step) / self.lr


def attach(optimizer: "torch.optim.Optimizer", schedule: LRSchedule, first_step: int = 0) -> "torch.optim.lr_scheduler.LambdaLR":
    """A LambdaLR that sets ``schedule.rate(first_step)`` now and the next step's rate at each of
    its ``step()`` calls (call it after every optimizer step). The groups' rate is this run's
    (``--lr``) whatever a loaded checkpoint held. LambdaLR's copy of the peak rate
    (``initial_lr``) is taken out of the groups again, so that a checkpoint holds the optimizer's
    own settings, as one saved without a schedule does (:func:`~.checkpoint.check_matches`)."""
    from torch.optim.lr_scheduler import LambdaLR

    for group in optimizer.param_groups:
        group["lr"] = schedule.lr  # the peak, which LambdaLR scales
    scheduler = LambdaLR(optimizer, lambda i: schedule.factor(first_step + i))
    for group in optimizer.param_groups:
        group.pop("initial_lr", None)
    return scheduler


def decay_groups(params: Iterable["torch.nn.Parameter"], weight_decay: float) -> list[dict]:
    """Optimizer parameter groups: matrices decayed by ``weight_decay``, the 1-D rest not."""
    params = list(params)
    matrices = [p for p in params if p.ndim >= 2]
    rest = [p for p in params if p.ndim < 2]
    return [{"params": matrices, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def default_weight_decay(optimizer: str, given: Optional[float]) -> float:
    """``--weight-decay`` or the optimizer's default: AdamW's 0.01 (torch's), SGD's 0."""
    if given is not None:
        return given
    return 0.01 if optimizer == "adamw" else 0.0
