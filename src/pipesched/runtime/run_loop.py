"""What happens between a run's steps, the same in the reference and on every pipeline rank:
the learning rate's next value, the held-out evaluation, the metrics of a logging interval.

``train_reference`` and ``train_worker`` (:mod:`.train`) each make one :class:`LoopHooks` once
the checkpoint (if any) is loaded and call :meth:`LoopHooks.after_step` after every step; what
it records comes back on the run's :class:`LoopRecord`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .lr_schedule import attach


@dataclass
class LoopRecord:
    """What the loop saw, per step of this run (resumed runs: from the resumed step on)."""

    lrs: list[float] = field(default_factory=list)  # the learning rate each step trained with


class LoopHooks:
    """The loop's part of one process: its scheduler (set for the first step to run)."""

    def __init__(self, cfg, optimizer: torch.optim.Optimizer, first_step: int) -> None:
        self.optimizer = optimizer
        self.scheduler = attach(optimizer, cfg.loop.lr_schedule_for(cfg.lr, cfg.steps), first_step)
        self.record = LoopRecord()

    def after_step(self) -> None:
        """Record the rate the step just taken trained with, and set the next step's."""
        self.record.lrs.append(self.optimizer.param_groups[0]["lr"])
        self.scheduler.step()
