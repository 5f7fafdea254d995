"""``pipesched train``'s loop options: the learning-rate schedule and weight decay, the held-out
evaluation, the metrics a run writes. Declared here as one group (:func:`loop_options` gives the
command a ``loop: LoopFlags``), checked here before any process starts (one line, exit 2).
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer

from ..errors import ConfigError
from ..outfiles import check_output_path
from ..runtime.training.loop_options import LoopOptions
from ..runtime.training.lr_schedule import SCHEDULES
from .option_group import option_group


@dataclass(frozen=True)
class LoopFlags:
    """The loop options as typed, before :meth:`options` checks them."""

    lr_schedule: str = "constant"
    warmup: int = 0
    min_lr: float = 0.0
    weight_decay: Optional[float] = None
    eval_every: Optional[int] = None
    eval_batches: int = 4
    log_every: int = 1
    metrics: Optional[Path] = None
    tensorboard: Optional[Path] = None
    peak_tflops: Optional[float] = None
    report: Optional[Path] = None

    def options(self, lr: float, steps: int, held_out: bool) -> LoopOptions:
        """The checked :class:`LoopOptions` (ConfigError on a bad value), for a peak rate ``lr``
        (``held_out``: whether --eval-data or --eval-share gives held-out data)."""
        if self.lr_schedule not in SCHEDULES:
            raise ConfigError(f"--lr-schedule {self.lr_schedule!r} is not known: use one of {', '.join(SCHEDULES)}")
        if not 0 <= self.warmup < steps:
            raise ConfigError(f"--warmup must be from 0 to below --steps ({steps}), got {self.warmup}")
        if not (math.isfinite(self.min_lr) and 0 <= self.min_lr <= lr):
            raise ConfigError(f"--min-lr must be from 0 to --lr ({lr:g}), got {self.min_lr:g}")
        if self.weight_decay is not None and not (math.isfinite(self.weight_decay) and 0 <= self.weight_decay < 1):
            raise ConfigError(f"--weight-decay must be from 0 to below 1, got {self.weight_decay:g}")
        if self.eval_every is not None and not held_out:
            raise ConfigError("--eval-every needs held-out data: --eval-data FILE or --eval-share SHARE (with --model hf:...)")
        for flag, value in (("--eval-every", self.eval_every), ("--eval-batches", self.eval_batches),
                            ("--log-every", self.log_every)):
            if value is not None and value < 1:
                raise ConfigError(f"{flag} must be at least 1, got {value}")
        if self.peak_tflops is not None and not (math.isfinite(self.peak_tflops) and self.peak_tflops > 0):
            raise ConfigError(f"--peak-tflops must be a finite number above 0, got {self.peak_tflops:g}")
        if self.metrics is not None:
            check_output_path(self.metrics, [".jsonl"])
        if self.report is not None:
            check_output_path(self.report, [".html"])
        if self.tensorboard is not None:
            if self.tensorboard.exists() and not self.tensorboard.is_dir():
                raise ConfigError(f"--tensorboard {str(self.tensorboard)!r} is a file, not a folder")
            if importlib.util.find_spec("tensorboard") is None:
                raise ConfigError("--tensorboard needs the tensorboard package: pip install 'pipesched[data]'")
        return LoopOptions(
            lr_schedule=self.lr_schedule, warmup=self.warmup, min_lr=self.min_lr, weight_decay=self.weight_decay,
            evaluate=held_out, eval_every=self.eval_every, eval_batches=self.eval_batches, log_every=self.log_every,
            metrics_path=_text(self.metrics), tensorboard_dir=_text(self.tensorboard), peak_tflops=self.peak_tflops,
            report_path=_text(self.report))


def _text(path: Optional[Path]) -> Optional[str]:
    return None if path is None else str(path)


LR_SCHEDULE = typer.Option(
    "constant", "--lr-schedule",
    help="constant, cosine or linear: after --warmup, the learning rate decays from --lr to --min-lr at the last step.")
WARMUP = typer.Option(0, "--warmup", help="Steps of linear warm-up: step s < N trains at --lr x (s+1)/(N+1).")
MIN_LR = typer.Option(0.0, "--min-lr", help="The learning rate the cosine or linear decay ends at (the last step).")
WEIGHT_DECAY = typer.Option(
    None, "--weight-decay",
    help="Weight decay of matrices (Linear, Embedding weights); biases and norm weights get none, as in the "
    "transformers Trainer (default: adamw 0.01, sgd 0).")

EVAL_EVERY = typer.Option(
    None, "--eval-every", help="Evaluate the held-out batches every N steps (and after the last): mean loss and perplexity.")
EVAL_BATCHES = typer.Option(4, "--eval-batches", help="Held-out batches of --batch-size an evaluation takes (the same each time).")

LOG_EVERY = typer.Option(1, "--log-every", help="Steps per logging interval (metrics, plain progress lines).")
METRICS = typer.Option(None, "--metrics", help="Append each logging interval's metrics to this file (.jsonl): loss, lr, "
                       "grad norm, tokens/s, MFU, step time, peak memory per rank, eval loss.")
TENSORBOARD = typer.Option(None, "--tensorboard", help="Write the metrics as TensorBoard scalars to this folder.")
PEAK_TFLOPS = typer.Option(None, "--peak-tflops", help="One device's peak TFLOP/s, for the MFU (default: known CUDA "
                           "devices' dense bf16 peak; on CPU no MFU).")
REPORT = typer.Option(None, "--report", help="Write an offline HTML report of the run (.html): loss and eval curves, "
                      "throughput, memory.")

LOOP_OPTIONS = (
    ("lr_schedule", str, LR_SCHEDULE), ("warmup", int, WARMUP), ("min_lr", float, MIN_LR),
    ("weight_decay", Optional[float], WEIGHT_DECAY), ("eval_every", Optional[int], EVAL_EVERY),
    ("eval_batches", int, EVAL_BATCHES), ("log_every", int, LOG_EVERY), ("metrics", Optional[Path], METRICS),
    ("tensorboard", Optional[Path], TENSORBOARD), ("peak_tflops", Optional[float], PEAK_TFLOPS),
    ("report", Optional[Path], REPORT),
)


def loop_options(command):
    """Give ``pipesched train`` the loop options in place of its ``loop: LoopFlags`` parameter."""
    return option_group("loop", LoopFlags, LOOP_OPTIONS)(command)
