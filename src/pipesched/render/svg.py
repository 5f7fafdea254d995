"""The Gantt chart as SVG text, written directly (no drawing library), fast enough for 50k boxes.

Fills come from CSS classes (one per kind and chunk) so each box costs a few dozen bytes; every
box carries a ``<title>`` tooltip with its action string, rank, start and end.
"""

from __future__ import annotations

from typing import Optional, Union
from xml.sax.saxutils import escape

from ..simulate import SimResult
from .layout import LABEL_W, LEGEND_Y, ROW_H, Chart, Scale, build_chart
from .palette import palette, text_colour
from .timeline import Timeline, as_timeline

FONT = "font-family:DejaVu Sans,Helvetica,Arial,sans-serif"


def gantt_svg(source: Union[SimResult, Timeline], scale: Optional[Scale] = None) -> str:
    """The SVG document for one timeline (a ``scale`` shared by several charts aligns them)."""
    timeline = as_timeline(source)
    return chart_svg(build_chart(timeline, scale), timeline.chunks, timeline.comm is not None)


def chart_svg(chart: Chart, chunks: int, comm: bool = False) -> str:
    out: list[str] = []
    w, h = _n(chart.width), _n(chart.height)
    out.append(
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" style="{FONT};background:#fff">'
    )
    out.append(_style(chunks, comm))
    out.append(f'<rect width="{w}" height="{h}" fill="#fff"/>')
    out.append(
        f'<text x="8" y="17" class="title"><tspan font-weight="bold">{escape(chart.title)}</tspan>'
        f'   {escape(chart.subtitle)}</text>'
    )
    _legend(out, chart)
    for lane in chart.lanes:
        out.append(f'<text x="{LABEL_W - 6}" y="{_n(lane.y + ROW_H / 2)}" class="rank">{lane.label}</text>')
        out.append(
            f'<rect class="lane" x="{LABEL_W}" y="{_n(lane.y)}" '
            f'width="{_n(chart.plot_x1 - LABEL_W)}" height="{ROW_H}"/>'
        )
    out.append('<g class="boxes">')
    for b in chart.boxes:
        out.append(
            f'<rect class="{b.style}" x="{_n(b.x)}" y="{_n(b.y)}" width="{_n(b.w)}" height="{_n(b.h)}">'
            f"<title>{b.tip}</title></rect>"
        )
    out.append("</g>")
    out.append('<g class="numbers">')
    for b in chart.boxes:
        if b.label:
            out.append(f'<text x="{_n(b.x + b.w / 2)}" y="{_n(b.y + b.h / 2)}" class="n{b.style}">{b.label}</text>')
    out.append("</g>")
    _memory(out, chart)
    _axis(out, chart)
    out.append("</svg>\n")
    return "\n".join(out)


def _style(chunks: int, comm: bool) -> str:
    rules = [
        ".title{font-size:13px}",
        ".legend{font-size:11px;dominant-baseline:central}",
        ".rank{font-size:11px;text-anchor:end;dominant-baseline:central}",
        ".lane{fill:#ececec}",
        ".boxes rect{stroke:#fff;stroke-width:0.5}",
        ".numbers text{font-size:10px;text-anchor:middle;dominant-baseline:central}",
        ".mem{fill:#ddd6ea;stroke:#5e4b8b;stroke-width:0.8}",
        ".peak{fill:#c00}",
        ".peaktext{font-size:9px;fill:#c00;dominant-baseline:central}",
        ".axis{stroke:#888;stroke-width:1}",
        ".tick{font-size:10px;text-anchor:middle;fill:#444}",
    ]
    for key, fill in palette(chunks, comm).items():
        rules.append(f".{key}{{fill:{fill}}} .n{key}{{fill:{text_colour(fill)}}}")
    return "<style>" + "\n".join(rules) + "</style>"


def _legend(out: list[str], chart: Chart) -> None:
    y = LEGEND_Y
    for x, key, words in chart.legend:
        if key:
            out.append(f'<rect class="{key}" x="{_n(x)}" y="{y - 5}" width="14" height="10"/>')
            out.append(f'<text x="{_n(x + 18)}" y="{y}" class="legend">{escape(words)}</text>')
        else:
            out.append(f'<text x="{_n(x)}" y="{y}" class="legend" fill="#555">{escape(words)}</text>')


def _memory(out: list[str], chart: Chart) -> None:
    if not chart.strips:
        return
    out.append('<g class="memory">')
    for strip in chart.strips:
        base_y = _n(strip.points[0][1])
        path = "M" + " L".join(f"{_n(x)} {_n(y)}" for x, y in strip.points)
        out.append(f'<path class="mem" d="{path} V{base_y} Z"/>')
        out.append(
            f'<circle class="peak" cx="{_n(strip.peak_x)}" cy="{_n(strip.peak_y)}" r="2">'
            f"<title>peak {strip.peak_text} M_B</title></circle>"
        )
        out.append(
            f'<text class="peaktext" x="{_n(strip.peak_x + 4)}" y="{_n(strip.peak_y + 2)}">'
            f"peak {strip.peak_text}</text>"
        )
    out.append("</g>")


def _axis(out: list[str], chart: Chart) -> None:
    y = _n(chart.axis_y)
    out.append(f'<line class="axis" x1="{LABEL_W}" x2="{_n(chart.plot_x1)}" y1="{y}" y2="{y}"/>')
    for x, label in chart.ticks:
        out.append(f'<line class="axis" x1="{_n(x)}" x2="{_n(x)}" y1="{y}" y2="{_n(chart.axis_y + 4)}"/>')
        out.append(f'<text class="tick" x="{_n(x)}" y="{_n(chart.axis_y + 14)}">{label}</text>')
    out.append(
        f'<text class="tick" x="{_n(chart.plot_x1)}" y="{_n(chart.axis_y + 24)}" '
        f'style="text-anchor:end">time ({escape(chart.unit)})</text>'
    )


def _n(value: float) -> str:
    """A coordinate with at most two decimals and no trailing zeros (keeps the file small)."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return text if text != "-0" else "0"
