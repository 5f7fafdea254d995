"""Chart geometry shared by the SVG and PNG writers: where every box, label and curve goes.

One row per rank: a light lane whose empty stretches are the bubbles, each action a box as wide
as its duration (an overlapped forward and backward: two half-height boxes in one slot, the
forward on top), and under it a thin strip with the rank's activations over time. All ranks'
strips share one vertical scale, so their heights compare.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

from ..execution import TOLERANCE
from .palette import BASE, COMM_NAMES, KIND_NAMES, style_key
from .timeline import Timeline, overlaps_previous, summary_line

LABEL_W = 62  # rank labels on the left
RIGHT_PAD = 24
TITLE_H = 44  # title line and legend
ROW_H = 20
MEM_H = 18
COMM_H = 8  # a rank's comm lane, under its actions
ROW_GAP = 7
AXIS_H = 34
DIGIT_W = 6.4  # width of one digit at the box font size, for "does the number fit"
CHAR_W = 6.3  # average width of one legend character
LEGEND_Y = 33
NOTE = "grey = idle (bubble)   curve under each rank = activations held (M_B)"
DEFAULT_WIDTH = 1100  # px the time axis aims for
MIN_PX, MAX_PX = 4.0, 48.0  # px per time unit
MAX_AXIS_WIDTH = 12_000  # px the time axis takes at most, however long the run: charts stay small


@dataclass(frozen=True)
class Scale:
    """Pixels per time unit, and how much time the axis covers (charts sharing one align)."""

    px_per_unit: float
    axis_end: float

    @classmethod
    def fit(cls, axis_end: float, width: float = DEFAULT_WIDTH) -> "Scale":
        """Aim for ``width`` px, keeping short actions readable (at least MIN_PX per unit) while
        the axis stays within MAX_AXIS_WIDTH (long runs get thinner boxes, not wider charts)."""
        axis_end = axis_end if axis_end > 0 else 1.0
        readable = min(MAX_PX, max(MIN_PX, width / axis_end))
        return cls(min(readable, MAX_AXIS_WIDTH / axis_end), axis_end)


class Box(NamedTuple):
    x: float
    y: float
    w: float
    h: float
    style: str  # palette style key, e.g. "F1"
    label: str  # microbatch number, "" when it does not fit
    tip: str  # action string, rank, start and end


class Strip(NamedTuple):
    """One rank's memory curve: step points in px, the peak's position and its text."""

    points: list[tuple[float, float]]
    peak_x: float
    peak_y: float
    peak_text: str


class Lane(NamedTuple):
    y: float
    label: str


@dataclass
class Chart:
    width: float
    height: float
    title: str
    subtitle: str
    legend: list[tuple[float, str, str]]  # (x, style key, words); the note follows the last
    lanes: list[Lane]
    boxes: list[Box] = field(default_factory=list)
    strips: list[Strip] = field(default_factory=list)
    ticks: list[tuple[float, str]] = field(default_factory=list)
    axis_y: float = 0.0
    plot_x1: float = 0.0
    unit: str = ""


def build_chart(timeline: Timeline, scale: Optional[Scale] = None) -> Chart:
    """Lay out ``timeline``; pass a shared ``scale`` to align several charts on one time axis."""
    scale = scale or Scale.fit(timeline.end)
    px = scale.px_per_unit
    has_memory = timeline.memory is not None
    comm_h = COMM_H if timeline.comm is not None else 0
    row_pitch = ROW_H + comm_h + (MEM_H if has_memory else 0) + ROW_GAP
    plot_x1 = LABEL_W + scale.axis_end * px
    axis_y = TITLE_H + timeline.ranks * row_pitch
    chunk = timeline.chunk_of_stage()
    legend = _legend(timeline, chunk)
    chart = Chart(
        width=max(plot_x1 + RIGHT_PAD, legend[-1][0] + CHAR_W * len(NOTE) + RIGHT_PAD),
        height=axis_y + AXIS_H,
        title=timeline.name,
        subtitle=summary_line(timeline),
        legend=legend,
        lanes=[Lane(TITLE_H + r * row_pitch, f"rank {r}") for r in range(timeline.ranks)],
        axis_y=axis_y,
        plot_x1=plot_x1,
        unit=timeline.unit,
    )
    for rank, spans in enumerate(timeline.spans):
        y = TITLE_H + rank * row_pitch
        for i, (action, start, end) in enumerate(spans):
            w = (end - start) * px
            mb = str(action.microbatch)
            top, h = y, ROW_H
            if overlaps_previous(spans, i):
                top, h = y + ROW_H / 2, ROW_H / 2
            elif i + 1 < len(spans) and overlaps_previous(spans, i + 1):
                h = ROW_H / 2
            chart.boxes.append(Box(
                LABEL_W + start * px, top, w, h,
                style_key(action.kind, chunk[action.stage]),
                mb if w >= DIGIT_W * len(mb) + 3 else "",
                f"{action}  rank {rank}  {start:.6g} \u2192 {end:.6g}",
            ))
    for rank, lane in enumerate(timeline.comm or ()):
        y = TITLE_H + rank * row_pitch + ROW_H + 1
        for kind, stage, start, end in lane:
            chart.boxes.append(Box(LABEL_W + start * px, y, (end - start) * px, COMM_H - 2, kind, "",
                                   f"{COMM_NAMES[kind]} of stage {stage}  rank {rank}  {start:.6g} \u2192 {end:.6g}"))
    if has_memory:
        peaks = timeline.peak_memory() or [0.0]
        top_level = max(peaks) or 1.0
        for rank, curve in enumerate(timeline.memory or ()):
            top = TITLE_H + rank * row_pitch + ROW_H + comm_h + 1
            chart.strips.append(_strip(curve, top, top_level, px, timeline.makespan))
    chart.ticks = [(LABEL_W + t * px, f"{t:g}") for t in _tick_times(scale.axis_end, px)]
    return chart


def _legend(timeline: Timeline, chunk: list[int]) -> list[tuple[float, str, str]]:
    """Swatches for the kinds and chunks present; the last entry (no swatch) is the note."""
    used = {(s.action.kind, chunk[s.action.stage]) for rs in timeline.spans for s in rs}
    many = timeline.chunks > 1
    entries, x = [], 8.0
    for k in BASE:
        for c in range(timeline.chunks):
            if (k, c) in used:
                words = f"{k} {KIND_NAMES[k]}" + (f" ({timeline.shade_label(c)})" if many else "")
                entries.append((x, style_key(k, c), words))
                x += 28 + CHAR_W * len(words)
    for kind in sorted({c[0] for lane in timeline.comm or () for c in lane}):
        entries.append((x, kind, COMM_NAMES[kind]))
        x += 28 + CHAR_W * len(COMM_NAMES[kind])
    entries.append((x + 10, "", NOTE))
    return entries


def _strip(curve, top: float, top_level: float, px: float, makespan: float) -> Strip:
    """Step curve of one rank's activations in the strip starting at ``top``; the peak where first reached."""
    bottom = top + MEM_H - 2
    height = MEM_H - 4

    def y_of(level: float) -> float:
        return bottom - height * level / top_level

    points: list[tuple[float, float]] = []
    level = 0.0
    peak_level, peak_time = 0.0, 0.0
    for time, new_level in curve:
        x = LABEL_W + time * px
        if points and abs(points[-1][0] - x) < TOLERANCE:
            points[-1] = (x, y_of(new_level))
        else:
            points.append((x, y_of(level)))
            points.append((x, y_of(new_level)))
        level = new_level
        if new_level > peak_level + 1e-12:
            peak_level, peak_time = new_level, time
    points.append((LABEL_W + makespan * px, y_of(level)))
    return Strip(points, LABEL_W + peak_time * px, y_of(peak_level), f"{peak_level:.3g}")


def _tick_times(axis_end: float, px: float) -> list[float]:
    """Round tick times at least ~70 px apart."""
    raw = 70 / px
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    count = int(axis_end / step + TOLERANCE)
    return [i * step for i in range(count + 1)]
