"""What happens between a run's steps, the same in the reference and on every pipeline rank:
the learning rate's next value, the held-out evaluation, the metrics of a logging interval.

``train_reference`` and ``train_worker`` (:mod:`.train`) each make one :class:`LoopHooks` once
the checkpoint (if any) is loaded and call :meth:`LoopHooks.after_step` after every step; what
it records comes back on the run's :class:`LoopRecord`. Evaluations and the memory of a
logging interval are collective: every rank calls ``after_step`` after every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from .lr_schedule import attach
from .metrics import MetricsLog
from .model_flops import flops_per_token, peak_flops
from .progress_display import ProgressDisplay

Evaluate = Callable[[list], float]  # held-out batches -> mean loss


@dataclass
class LoopRecord:
    """What the loop saw, per step of this run (resumed runs: from the resumed step on)."""

    lrs: list[float] = field(default_factory=list)  # the learning rate each step trained with
    evals: list[tuple[int, float]] = field(default_factory=list)  # (steps done, mean held-out loss)
    metrics: list[dict] = field(default_factory=list)  # one per logging interval (metrics.py), rank 0's


class LoopHooks:
    """The loop's part of one process: its scheduler (set for the first step to run), the
    held-out batches and how to evaluate them, the metrics log (rank 0 writes it)."""

    def __init__(self, cfg, md, optimizer: torch.optim.Optimizer, first_step: int, evaluate: Optional[Evaluate],
                 metrics: MetricsLog) -> None:
        self.cfg = cfg
        self.optimizer = optimizer
        self.scheduler = attach(optimizer, cfg.loop.lr_schedule_for(cfg.lr, cfg.steps), first_step)
        self.evaluate = evaluate if cfg.loop.evaluate else None
        self.eval_batches = ([md.eval_batch(i, cfg.batch_size) for i in range(cfg.loop.eval_batches)]
                             if self.evaluate is not None else [])
        self.metrics = metrics
        self.record = LoopRecord(metrics=metrics.rows)

    def after_step(self, steps_done: int, loss: float, seconds: float, grad_norm: float, skipped: bool = False) -> None:
        """After step ``steps_done`` (1-based): record its rate and set the next step's, evaluate
        when due, and log the interval when it ends."""
        lr = self.optimizer.param_groups[0]["lr"]
        self.record.lrs.append(lr)
        self.scheduler.step()
        eval_loss = None
        if self.evaluate is not None and self.cfg.loop.eval_due(steps_done, self.cfg.steps):
            eval_loss = self.evaluate(self.eval_batches)
            self.record.evals.append((steps_done, eval_loss))
        self.metrics.step(steps_done, loss, lr, seconds, grad_norm, eval_loss, skipped)

    def after_pipeline_step(self, runtime, result) -> None:
        """:meth:`after_step` for a pipeline rank's step (``result``: its StepResult); the gradient
        norm is the step's (clipping computes it) or, where metrics are written, measured here."""
        norm = result.grad_norm
        if self.cfg.options.clip_grad_norm is None and self.cfg.loop.watched:
            norm = runtime.grad_norm()
        if self.metrics.bubble is not None:
            self.metrics.bubble.add(result.spans)
        self.after_step(runtime.steps_done, result.loss, result.step_time, norm, result.skipped)

    def close(self) -> None:
        self.metrics.close()


def make_hooks(cfg, md, optimizer: torch.optim.Optimizer, first_step: int, evaluate: Optional[Evaluate], *,
               writer: bool, gather_memory: Callable[[], list[int]], device: torch.device, name: str,
               bubble=None) -> LoopHooks:
    """The hooks of one process of a run (``writer``: rank 0, which logs and shows progress;
    ``bubble``: a pipeline's IntervalBubble, kept where the metrics are written)."""
    x, _ = md.batch(0, 1, cfg.options.seed)
    tokens_per_sample = x.numel() if not x.is_floating_point() else 1  # token ids: each counts; features: the sample
    flops = peak = None
    if writer:
        flops = flops_per_token(md, tokens_per_sample)
        peak = peak_flops(device, cfg.loop.peak_tflops)
    if writer and cfg.show_progress and first_step:
        print(resuming_line(first_step, cfg.resume_from), flush=True)
    display = ProgressDisplay(cfg.steps, name, first_step) if writer and cfg.show_progress else None
    metrics = MetricsLog(cfg, first_step, cfg.batch_size * tokens_per_sample, flops, peak, writer, gather_memory, display,
                         bubble if cfg.loop.watched else None)
    if writer and cfg.show_progress and metrics.moved is not None:
        print(f"the metrics the interrupted run logged after step {first_step} are kept in {metrics.moved}", flush=True)
    return LoopHooks(cfg, md, optimizer, first_step, evaluate, metrics)


def resuming_line(step: int, folder: Optional[str]) -> str:
    """What a resumed run says first: the step it resumes from and when that checkpoint was
    written (its manifest's time, in this machine's time zone)."""
    from datetime import datetime
    from pathlib import Path

    from ..runtime.checkpoints.checkpoint_manifest import MANIFEST

    try:
        written = datetime.fromtimestamp((Path(folder) / MANIFEST).stat().st_mtime).astimezone()
        when = f" (written at {written.isoformat(sep=' ', timespec='seconds')})"
    except (OSError, TypeError, ValueError):
        when = ""
    return f"resuming from step {step}{when}"
