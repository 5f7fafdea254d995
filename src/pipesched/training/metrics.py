"""The metrics of each logging interval (``--log-every`` steps), as people watch a run: loss,
learning rate, gradient norm, tokens per second (global and per device), model FLOPs
utilization, step time, its bubble share measured against the simulated one (pipelines), peak
memory per rank, and the held-out loss and perplexity when an evaluation ran in the interval.

Rank 0 writes each interval as one JSON object a line (``--metrics FILE.jsonl``, flushed at once:
``tail -f`` follows it; a resumed run continues the file from its checkpoint's step:
:mod:`.report.metrics_file`), as TensorBoard scalars (``--tensorboard DIR``:
:mod:`.tensorboard_sink`) and on the progress display. Every rank takes part in
gathering the memory figures, so every rank logs at the same steps.

- tokens/s: the interval's tokens (``--batch-size`` x sequence length a step) over the sum of its
  step times; per device: over the world's processes.
- MFU: tokens/s per device x the model's FLOPs per token (:mod:`.model_flops`) / the device's
  peak (``--peak-tflops``, or the device's known peak; absent where neither is known).
- peak memory per rank: on CUDA the device's most allocated bytes so far, elsewhere the
  process's peak resident memory (everything it holds, not only the model); gathered (a
  collective) only when the metrics go to a file, TensorBoard or the report.
- grad norm: the whole model's gradient norm before clipping, after the last step of the interval.
- bubble share: measured from the interval's action spans, simulated for the schedule under
  costs measured from the same spans (:mod:`..metering.bubble_share`); gathered (a collective)
  with the memory, so only where the metrics are written; absent for the one-process reference.
"""

from __future__ import annotations

import json
import math
import resource
from pathlib import Path
from time import perf_counter
from typing import Callable, Optional


class MetricsLog:
    """Interval sums of one process, and rank 0's sinks (``writer``: whether this is rank 0)."""

    def __init__(self, cfg, first_step: int, tokens_per_step: int, flops_per_token: Optional[float],
                 peak_flops: Optional[float], writer: bool, gather_memory: Callable[[], list[int]], display=None,
                 bubble=None) -> None:
        self.cfg, self.options = cfg, cfg.loop
        self.first_step = first_step
        self.tokens_per_step = tokens_per_step
        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops
        self.writer = writer
        self.gather_memory = gather_memory
        self.display = display
        self.bubble = bubble  # an IntervalBubble where a pipeline's metrics are written, fed by the loop's hooks
        self.rows: list[dict] = []
        self.earlier_s, self.moved = 0.0, None  # a resumed run: the elapsed time it continues, lines set aside
        if writer and self.options.metrics_path and first_step:
            from .report.metrics_file import continue_after

            self.earlier_s, self.moved = continue_after(Path(self.options.metrics_path), first_step)
        self.started = perf_counter()
        self._reset()
        self.file = open(self.options.metrics_path, "a", encoding="utf-8") if writer and self.options.metrics_path else None
        self.board = None
        if writer and self.options.tensorboard_dir:
            from .tensorboard_sink import TensorBoardSink

            self.board = TensorBoardSink(self.options.tensorboard_dir)

    def _reset(self) -> None:
        self.losses, self.seconds, self.evaluation = [], [], None

    def step(self, steps_done: int, loss: float, lr: float, seconds: float, grad_norm: float,
             eval_loss: Optional[float], skipped: bool = False) -> None:
        """Count step ``steps_done``; at the interval's end (or the run's), log it (collective)."""
        self.losses.append(loss)
        self.seconds.append(seconds)
        if eval_loss is not None:
            self.evaluation = (steps_done, eval_loss)
        if self.display is not None:
            self.display.step(loss, lr, seconds, skipped, eval_loss)
        if (steps_done - self.first_step) % self.options.log_every and steps_done != self.cfg.steps:
            return
        memory = self.gather_memory() if self.options.watched else []  # a collective: only where it is written
        bubble = self.bubble.figures() if self.bubble is not None else {}  # a collective too
        if self.writer:
            self._write({**self._row(steps_done, lr, grad_norm, memory), **bubble})
        self._reset()

    def _row(self, steps_done: int, lr: float, grad_norm: float, memory: list[int]) -> dict:
        busy = sum(self.seconds)
        tokens_per_s = self.tokens_per_step * len(self.seconds) / busy if busy > 0 else 0.0
        per_device = tokens_per_s / self.cfg.world
        row = {"step": steps_done, "loss": sum(self.losses) / len(self.losses), "lr": lr, "grad_norm": grad_norm,
               "tokens_per_s": tokens_per_s, "tokens_per_s_per_device": per_device,
               "step_time_s": busy / len(self.seconds), "peak_memory_bytes": memory,
               "elapsed_s": self.earlier_s + perf_counter() - self.started}
        if self.flops_per_token is not None and self.peak_flops:
            row["mfu"] = per_device * self.flops_per_token / self.peak_flops
        if self.evaluation is not None:
            row.update(eval_step=self.evaluation[0], eval_loss=self.evaluation[1],
                       eval_perplexity=perplexity(self.evaluation[1]))
        return row

    def _write(self, row: dict) -> None:
        self.rows.append(row)
        if self.file is not None:
            self.file.write(json.dumps({k: _json_number(v) for k, v in row.items()}) + "\n")
            self.file.flush()
        if self.board is not None:
            self.board.write(row)
        if self.display is not None:
            remaining = (self.cfg.steps - row["step"]) * row["step_time_s"]
            self.display.interval(row, remaining)

    def close(self) -> None:
        for sink in (self.file, self.board, self.display):
            if sink is not None:
                sink.close()


def _json_number(value):
    """``value``, but None for NaN or infinity (a skipped step's loss): JSON has no such numbers."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def gather_peaks(device) -> list[int]:
    """Every rank's :func:`own_peak_memory`, in global rank order (collective)."""
    import torch.distributed as dist

    peaks = [None] * dist.get_world_size()
    dist.all_gather_object(peaks, own_peak_memory(device))
    return peaks


def own_peak_memory(device) -> int:
    """This process's peak: the device's most allocated bytes on CUDA, else its peak resident memory."""
    if device is not None and device.type == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def perplexity(loss: float) -> float:
    """exp(mean cross-entropy), inf where that overflows a float."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf
