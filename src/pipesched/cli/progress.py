"""A word on the terminal while planning runs long enough to wonder about (a few seconds)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from ..planning import SHOW_PROGRESS_FROM


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
