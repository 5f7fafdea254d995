"""The timeline in the terminal: one line of coloured cells per rank, time scaled to the width.

Each cell shows the action covering its time slice (an overlapped forward and backward share
their slot: the forward's colour in its first half, the backward's in its second); the microbatch number is printed where its
box is wider than the number (so numbers never run together), idle time is a dim dot, so the
bubbles show as gaps.
"""

from __future__ import annotations

import textwrap
from typing import Optional, Union

from rich.console import Console
from rich.text import Text

from ..simulate import SimResult
from .palette import BASE, KIND_NAMES, box_colour, style_key, text_colour
from .timeline import Timeline, as_timeline, overlaps_previous, summary_line

LABEL = "rank {:>2} "
IDLE = "\u00b7"


def timeline_text(source: Union[SimResult, Timeline], width: int) -> Text:
    """The chart as rich Text fitting ``width`` columns (title, rows, legend)."""
    timeline = as_timeline(source)
    label_w = len(LABEL.format(0))
    columns = max(10, width - label_w - 1)
    step = (timeline.makespan or 1.0) / columns
    chunk = timeline.chunk_of_stage()
    chunks = timeline.chunks
    out = Text()
    out.append(timeline.name, style="bold")
    summary = summary_line(timeline)
    if len(timeline.name) + 2 + len(summary) <= width:
        out.append(f"  {summary}\n")
    else:
        out.append("\n" + "\n".join(textwrap.wrap(summary, width)) + "\n")
    for rank, spans in enumerate(timeline.spans):
        cells = _cells(spans, columns, step)
        out.append(LABEL.format(rank), style="bold")
        column = 0
        while column < columns:
            index = cells[column]
            if index is None:
                out.append(IDLE, style="grey50")
                column += 1
                continue
            run = column
            while run < columns and cells[run] == index:
                run += 1
            action = spans[index].action
            fill = box_colour(action.kind, chunk[action.stage], chunks)
            number = str(action.microbatch)
            body = number.center(run - column) if len(number) < run - column else " " * (run - column)
            out.append(body, style=f"{text_colour(fill)} on {fill}")
            column = run
        out.append("\n")
    out.append(f"{' ' * label_w}1 column = {step:.3g} {timeline.unit}; {IDLE} = idle\n", style="grey50")
    used = {style_key(s.action.kind, chunk[s.action.stage]) for rs in timeline.spans for s in rs}
    line_w = label_w
    out.append(" " * label_w)
    for kind in BASE:
        for c in range(chunks):
            if style_key(kind, c) not in used:
                continue
            swatch = f" {kind}{c if chunks > 1 else ''} "
            words = f" {KIND_NAMES[kind]}{f' {timeline.shade_label(c)}' if chunks > 1 else ''}  "
            if line_w + len(swatch) + len(words) > width and line_w > label_w:
                out.append("\n" + " " * label_w)
                line_w = label_w
            fill = box_colour(kind, c, chunks)
            out.append(swatch, style=f"{text_colour(fill)} on {fill}")
            out.append(words)
            line_w += len(swatch) + len(words)
    return out


def print_timeline(source: Union[SimResult, Timeline], console: Optional[Console] = None) -> None:
    """Print the chart scaled to the console's width."""
    console = console or Console()
    console.print(timeline_text(source, console.width), soft_wrap=True, no_wrap=True, overflow="crop")


def _cells(spans, columns: int, step: float) -> list[Optional[int]]:
    """Which span (index) each column shows: boxes snap to the nearest column edges; a box too
    short for a column of its own still shows in the column holding its middle if that is free."""
    cells: list[Optional[int]] = [None] * columns
    short = []
    for index, (_action, start, end) in enumerate(spans):
        first = min(columns, int(start / step + 0.5))
        last = min(columns, int(end / step + 0.5))
        if overlaps_previous(spans, index):
            first = (first + last + 1) // 2  # the pair's forward keeps the first half
        if last > first:
            cells[first:last] = [index] * (last - first)
        else:
            short.append((index, min(columns - 1, int((start + end) / 2 / step))))
    for index, column in short:
        if cells[column] is None:
            cells[column] = index
    return cells
