"""The run's progress on rank 0: a rich progress bar with an ETA on a terminal, plain lines when
the output is piped or written to a file (one per logging interval: a log stays readable). Both
show the loss, the learning rate and the latest held-out loss."""

from __future__ import annotations

import sys
from typing import Optional


class ProgressDisplay:
    """A bar (terminal) or lines (otherwise) for a run of ``steps`` steps, ``done`` of them before."""

    def __init__(self, steps: int, name: str, done: int = 0, terminal: Optional[bool] = None) -> None:
        self.steps = steps
        self.name = name
        self.terminal = sys.stdout.isatty() if terminal is None else terminal
        self.bar = None
        self.latest_eval = ""  # the plain lines' held-out loss, the latest evaluation's
        if self.terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(
                TextColumn(f"[bold]{name}[/bold]"), BarColumn(), MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}"), TextColumn("lr {task.fields[lr]}"),
                TextColumn("eval loss {task.fields[eval]}"), TextColumn("step {task.fields[ms]} ms"),
                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), transient=False,
            )
            self.task = self.bar.add_task("train", total=steps, completed=done, loss="-", lr="-", eval="-", ms="-")
            self.bar.start()

    def step(self, loss: float, lr: float, seconds: float, skipped: bool, eval_loss: Optional[float] = None) -> None:
        """One step done (the bar moves, its held-out loss the latest evaluation's; lines wait
        for the interval)."""
        if self.bar is not None:
            text = f"{loss:.5f}" + (" (skipped)" if skipped else "")
            fields = {"eval": f"{eval_loss:.5f}"} if eval_loss is not None else {}
            self.bar.update(self.task, advance=1, loss=text, lr=f"{lr:.3g}", ms=f"{1000 * seconds:.1f}", **fields)

    def interval(self, row: dict, eta_s: float) -> None:
        """A logging interval's metrics (:mod:`.metrics`): one plain line when not on a terminal."""
        if self.bar is not None:
            return
        parts = [f"{self.name} step {row['step']}/{self.steps}", f"loss {row['loss']:.5f}", f"lr {row['lr']:.3g}",
                 f"{row['tokens_per_s']:.0f} tok/s", f"step {1000 * row['step_time_s']:.1f} ms"]
        if "mfu" in row:
            parts.append(f"mfu {100 * row['mfu']:.1f}%")
        if "bubble_share" in row:
            parts.append(f"bubble {100 * row['bubble_share']:.0f}% (simulated {100 * row['simulated_bubble_share']:.0f}%)")
        if "eval_loss" in row:
            self.latest_eval = (f"eval loss {row['eval_loss']:.5f} "
                                f"(ppl {row['eval_perplexity']:.2f}, step {row['eval_step']})")
        if self.latest_eval:
            parts.append(self.latest_eval)
        parts.append(f"eta {eta_s:.0f} s")
        print("  ".join(parts), flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
