"""A small SVG line chart (inline, no script): one or more series over the steps of a run.

Each series is a polyline with a dot at every point (a series of one point is a dot), in its own
colour, named in a legend; axes show the first and last step and the value range. What the run
report (:mod:`.run_report`) draws its curves with.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Sequence

WIDTH, HEIGHT = 640, 220
LEFT, RIGHT, TOP, BOTTOM = 70, 16, 28, 30


@dataclass(frozen=True)
class Series:
    """Points (step, value) of one curve, its name and colour."""

    name: str
    points: tuple[tuple[float, float], ...]
    colour: str


def line_chart_svg(title: str, series: Sequence[Series], unit: str = "") -> str:
    """The chart's SVG element (empty series are left out; no points at all: a note instead)."""
    drawn = [s for s in series if s.points]
    if not drawn:
        return f'<p class="note">{escape(title)}: nothing measured.</p>'
    xs = [x for s in drawn for x, _ in s.points]
    ys = [y for s in drawn for _, y in s.points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if y1 == y0:  # a flat curve sits in the middle
        y0, y1 = y0 - (abs(y0) or 1) * 0.05, y1 + (abs(y1) or 1) * 0.05
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def at(x: float, y: float) -> tuple[float, float]:
        fx = (x - x0) / (x1 - x0) if x1 > x0 else 0.5
        return LEFT + fx * plot_w, TOP + (1 - (y - y0) / (y1 - y0)) * plot_h

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" role="img" '
             f'aria-label="{escape(title)}">',
             f'<text x="{LEFT}" y="16" font-size="13" font-weight="bold">{escape(title)}</text>',
             f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#bbb"/>',
             _label(LEFT - 6, TOP + 10, _number(y1) + unit, "end"),
             _label(LEFT - 6, TOP + plot_h, _number(y0) + unit, "end"),
             _label(LEFT, HEIGHT - 10, f"step {_number(x0)}", "start"),
             _label(WIDTH - RIGHT, HEIGHT - 10, f"step {_number(x1)}", "end")]
    legend_x = LEFT + 8
    for s in drawn:
        placed = [at(x, y) for x, y in s.points]
        if len(placed) > 1:
            path = " ".join(f"{px:.1f},{py:.1f}" for px, py in placed)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{s.colour}" stroke-width="3"/>')
        parts.extend(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="4" fill="{s.colour}"/>' for px, py in placed)
        parts.append(f'<rect x="{legend_x}" y="{TOP + 6}" width="10" height="10" fill="{s.colour}"/>')
        parts.append(_label(legend_x + 14, TOP + 15, s.name, "start"))
        legend_x += 24 + 7 * len(s.name)
    parts.append("</svg>")
    return "".join(parts)


def _label(x: float, y: float, text: str, anchor: str) -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="11" fill="#444" text-anchor="{anchor}">{escape(text)}</text>'


def _number(value: float) -> str:
    return f"{value:.4g}"
