"""What a training run does around its steps: the learning-rate schedule and weight decay, the
held-out evaluation, the metrics it writes (one :class:`LoopOptions` on
:class:`~pipesched.training.train.TrainConfig`, picklable for the spawned ranks).

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
    evaluate: bool = False  # whether the model has held-out data (--eval-data, --eval-share)
    eval_every: Optional[int] = None  # --eval-every: evaluate every N steps (and always after the last)
    eval_batches: int = 4  # --eval-batches: how many held-out batches of --batch-size an evaluation takes
    log_every: int = 1  # --log-every: steps per logging interval (metrics, progress lines)
    metrics_path: Optional[str] = None  # --metrics FILE.jsonl
    tensorboard_dir: Optional[str] = None  # --tensorboard DIR
    peak_tflops: Optional[float] = None  # --peak-tflops: one device's peak, for the MFU
    report_path: Optional[str] = None  # --report FILE.html

    @property
    def watched(self) -> bool:
        """Whether the metrics go anywhere but the progress display (then every figure is measured)."""
        return bool(self.metrics_path or self.tensorboard_dir or self.report_path)

    def lr_schedule_for(self, lr: float, steps: int) -> LRSchedule:
        """The run's learning rate per step (peak ``lr``, ``steps`` in all)."""
        return LRSchedule(lr, steps, self.lr_schedule, self.warmup, self.min_lr)

    def eval_due(self, steps_done: int, steps: int) -> bool:
        """Whether to evaluate after ``steps_done`` steps of ``steps``."""
        every = self.eval_every is not None and steps_done % self.eval_every == 0
        return self.evaluate and (every or steps_done == steps)
