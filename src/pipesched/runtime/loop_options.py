"""What a training run does around its steps: the learning-rate schedule and weight decay, the
held-out evaluation, the metrics it writes (one :class:`LoopOptions` on
:class:`~pipesched.runtime.train.TrainConfig`, picklable for the spawned ranks).

Importing this module does not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .lr_schedule import LRSchedule


@dataclass(frozen=True)
class LoopOptions:
    """The options of ``pipesched train``'s loop (the command line's names in the comments)."""

    lr_schedule: str = "constant"  # --lr-schedule: constant, cosine or linear
    warmup: int = 0  # --warmup: steps of linear warm-up
    min_lr: float = 0.0  # --min-lr: where the decay ends (the last step)
    weight_decay: Optional[float] = None  # --weight-decay (None: the optimizer's default), matrices only
    eval_every: Optional[int] = None  # --eval-every: evaluate the held-out batches every N steps (and after the last)
    eval_batches: int = 4  # --eval-batches: how many held-out batches of --batch-size an evaluation takes
    log_every: int = 1  # --log-every: steps per logging interval (metrics, progress lines)
    metrics_path: Optional[str] = None  # --metrics FILE.jsonl
    tensorboard_dir: Optional[str] = None  # --tensorboard DIR
    peak_tflops: Optional[float] = None  # --peak-tflops: one device's peak, for the MFU

    def lr_schedule_for(self, lr: float, steps: int) -> LRSchedule:
        """The run's learning rate per step (peak ``lr``, ``steps`` in all)."""
        return LRSchedule(lr, steps, self.lr_schedule, self.warmup, self.min_lr)

    def eval_due(self, steps_done: int, steps: int) -> bool:
        """Whether to evaluate after ``steps_done`` steps of ``steps``."""
        return self.eval_every is not None and (steps_done % self.eval_every == 0 or steps_done == steps)
