"""The figures a run is summed up by, each computed once, from the run's logging intervals (the
rows of :mod:`pipesched.training.metrics`, the lines of its ``--metrics`` file), so that the
terminal, ``--summary``, the report's table, its text and its chart all show the same number.

- the median step time: the median over the logging intervals after the first (it holds the
  warm-up step) of the interval's mean step time; with ``--log-every 1``, the median step.
- the bubble: the measured bubble share of the median logging interval (the lower median, so that
  it is one interval's, after the first where there are several), beside the simulator's share
  for that interval (:mod:`pipesched.runtime.metering.bubble_share`).
- the layout: ``pp × dp × dp_shard × tp``.

Pure Python: no torch.
"""

from __future__ import annotations

import statistics
from typing import Optional, Sequence


def after_warmup(rows: Sequence[dict]) -> Sequence[dict]:
    """The logging intervals after the first (the first holds the warm-up step), or the only one."""
    return rows[1:] or rows


def median_step_s(rows: Sequence[dict]) -> Optional[float]:
    """The run's median step time in seconds (see the module's docstring); None without a row."""
    times = [r["step_time_s"] for r in after_warmup(rows)]
    return statistics.median(times) if times else None


def bubble_interval(rows: Sequence[dict]) -> Optional[dict]:
    """The logging interval whose measured bubble share is the run's (the lower median over the
    intervals after the first that have one); None where no interval measured it."""
    measured = [r for r in rows if r.get("bubble_share") is not None]
    if not measured:
        return None
    shares = sorted(after_warmup(measured), key=lambda r: r["bubble_share"])
    return shares[(len(shares) - 1) // 2]


def layout_text(pp: int, dp: int, dp_shard: int, tp: int) -> str:
    """The processes' layout in one phrase: ``layout 2 pp × 1 dp × 2 dp_shard × 1 tp (4 processes)``."""
    return f"layout {pp} pp × {dp} dp × {dp_shard} dp_shard × {tp} tp ({pp * dp * dp_shard * tp} processes)"
