"""``pipesched train``'s loop options: the learning-rate schedule and weight decay, the held-out
evaluation, the metrics a run writes. Declared here as one group (:func:`loop_options` gives the
command a ``loop: LoopFlags``), checked here before any process starts (one line, exit 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import typer

from ..errors import ConfigError
from ..runtime.loop_options import LoopOptions
from ..runtime.lr_schedule import SCHEDULES
from .option_group import option_group


@dataclass(frozen=True)
class LoopFlags:
    """The loop options as typed, before :meth:`options` checks them."""

    lr_schedule: str = "constant"
    warmup: int = 0
    min_lr: float = 0.0
    weight_decay: Optional[float] = None

    def options(self, lr: float, steps: int) -> LoopOptions:
        """The checked :class:`LoopOptions` (ConfigError on a bad value), for a peak rate ``lr``."""
        if self.lr_schedule not in SCHEDULES:
            raise ConfigError(f"--lr-schedule {self.lr_schedule!r} is not known: use one of {', '.join(SCHEDULES)}")
        if not 0 <= self.warmup < steps:
            raise ConfigError(f"--warmup must be from 0 to below --steps ({steps}), got {self.warmup}")
        if not (math.isfinite(self.min_lr) and 0 <= self.min_lr <= lr):
            raise ConfigError(f"--min-lr must be from 0 to --lr ({lr:g}), got {self.min_lr:g}")
        if self.weight_decay is not None and not (math.isfinite(self.weight_decay) and 0 <= self.weight_decay < 1):
            raise ConfigError(f"--weight-decay must be from 0 to below 1, got {self.weight_decay:g}")
        return LoopOptions(self.lr_schedule, self.warmup, self.min_lr, self.weight_decay)


LR_SCHEDULE = typer.Option(
    "constant", "--lr-schedule",
    help="constant, cosine or linear: after --warmup, the learning rate decays from --lr to --min-lr at the last step.")
WARMUP = typer.Option(0, "--warmup", help="Steps of linear warm-up: step s < N trains at --lr x (s+1)/(N+1).")
MIN_LR = typer.Option(0.0, "--min-lr", help="The learning rate the cosine or linear decay ends at (the last step).")
WEIGHT_DECAY = typer.Option(
    None, "--weight-decay",
    help="Weight decay of matrices (Linear, Embedding weights); biases and norm weights get none, as in the "
    "transformers Trainer (default: adamw 0.01, sgd 0).")

LOOP_OPTIONS = (
    ("lr_schedule", str, LR_SCHEDULE), ("warmup", int, WARMUP), ("min_lr", float, MIN_LR),
    ("weight_decay", Optional[float], WEIGHT_DECAY),
)


def loop_options(command):
    """Give ``pipesched train`` the loop options in place of its ``loop: LoopFlags`` parameter."""
    return option_group("loop", LoopFlags, LOOP_OPTIONS)(command)
