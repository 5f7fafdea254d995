"""A word on the terminal while planning runs long enough to wonder about (a few seconds)."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Iterator, Optional, TextIO

from ..planning import SHOW_PROGRESS_FROM
from ..units import format_seconds


@contextmanager
def planning_progress(label: str, work: int) -> Iterator[None]:
    """Show a spinner and the elapsed time on stderr while the block plans ``work`` actions.

    Only on a terminal and only for work that takes a few seconds (:data:`SHOW_PROGRESS_FROM`);
    the line disappears when the block ends, so output and pipes stay clean.
    """
    if work < SHOW_PROGRESS_FROM:  # the common case: no need to load rich
        yield
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not console.is_terminal:
        yield
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        progress.add_task(f"planning {label}: about {work / 1e6:.2g}M actions to build and simulate", total=None)
        yield


LAYOUT_LINE_EVERY = 5.0  # seconds between progress lines on a terminal
LAYOUT_LINE_LONG = 30.0  # off a terminal (a log, CI): a line only once the search has run this long, and so often


class LayoutProgress:
    """``advise --gpus``'s progress: after each layout (or group of them) given its verdict, a
    line on stderr saying how many of how many and the time elapsed, on a terminal once the
    search has run a few seconds, elsewhere once it has run long; stdout (``--json``) never."""

    def __init__(self, stream: Optional[TextIO] = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.monotonic()
        self.shown = self.started

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        every = LAYOUT_LINE_EVERY if self.stream.isatty() else LAYOUT_LINE_LONG
        if now - self.shown >= every and done < total:
            self.shown = now
            print(f"pipesched advise: {done} of {total} layouts done, {format_seconds(now - self.started)} elapsed",
                  file=self.stream, flush=True)
