"""The SVG Gantt chart: valid XML, one box with a tooltip per action, time-proportional widths."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

import pipesched
from pipesched.render.layout import LABEL_W, Scale
from pipesched.render.svg import gantt_svg

NS = {"s": "http://www.w3.org/2000/svg"}
UNEVEN = pipesched.Costs(F=1, B=1.4, W=0.6, comm=0.1, stage_multipliers=(1.3, 1, 1, 1.2))
CASES = [("zb-v", 4, 8), ("interleaved-1f1b", 4, 8), ("1f1b", 4, 6), ("zb-h2", 4, 8), ("gpipe", 2, 3)]


def boxes(svg_text: str) -> list[ET.Element]:
    """Rects that carry a <title>: the action boxes (and nothing else)."""
    root = ET.fromstring(svg_text)
    return [r for r in root.iter("{%s}rect" % NS["s"]) if r.find("s:title", NS) is not None]


def tooltip_action(rect: ET.Element) -> str:
    return rect.find("s:title", NS).text.split()[0]


@pytest.mark.parametrize("name,p,m", CASES)
def test_one_box_with_tooltip_per_action(name, p, m):
    result = pipesched.simulate(pipesched.build_schedule(name, p, m), UNEVEN)
    found = [tooltip_action(r) for r in boxes(gantt_svg(result))]
    expected = [str(a) for _, a in result.schedule.actions()]
    assert len(found) == len(expected)
    assert sorted(found) == sorted(expected)


@pytest.mark.parametrize("name,p,m", CASES)
def test_box_widths_and_positions_follow_simulated_time(name, p, m):
    result = pipesched.simulate(pipesched.build_schedule(name, p, m), UNEVEN)
    spans = {str(s.action): s for rank in result.timeline for s in rank}
    placed = sorted((spans[tooltip_action(r)], float(r.get("x")), float(r.get("width"))) for r in boxes(gantt_svg(result)))
    (first, x_first, _), (last, x_last, _) = min(placed, key=lambda t: t[0].start), max(placed, key=lambda t: t[0].start)
    px_per_unit = (x_last - x_first) / (last.start - first.start)
    origin = x_first - first.start * px_per_unit
    for span, x, width in placed:  # coordinates are written with two decimals
        assert width == pytest.approx((span.end - span.start) * px_per_unit, abs=0.011)
        assert x == pytest.approx(origin + span.start * px_per_unit, abs=0.011)
    assert len({round(w, 1) for _, _, w in placed}) >= 2  # durations really differ


def test_tooltip_names_rank_start_and_end():
    result = pipesched.simulate(pipesched.build_schedule("1f1b", 2, 2), UNEVEN)
    tips = {r.find("s:title", NS).text for r in boxes(gantt_svg(result))}
    for rank, spans in enumerate(result.timeline):
        for s in spans:
            assert f"{s.action}  rank {rank}  {s.start:.6g} \u2192 {s.end:.6g}" in tips


def test_title_line_holds_the_metrics():
    result = pipesched.simulate(pipesched.build_schedule("zb-v", 4, 8))
    root = ET.fromstring(gantt_svg(result))
    title = "".join(next(t for t in root.iter("{%s}text" % NS["s"])).itertext())
    for part in ("zb-v", "p=4", "m=8", "v=2", f"makespan {result.makespan:.4g}", f"span {result.span:.4g}",
                 f"bubble {100 * result.bubble_ratio:.1f}%", f"peak memory {result.max_peak_memory:.3g}"):
        assert part in title


def test_memory_curve_per_rank_with_its_peak_marked():
    result = pipesched.simulate(pipesched.build_schedule("1f1b", 4, 8))
    root = ET.fromstring(gantt_svg(result))
    curves = [e for e in root.iter("{%s}path" % NS["s"]) if e.get("class") == "mem"]
    peaks = [e.text for e in root.iter("{%s}text" % NS["s"]) if e.get("class") == "peaktext"]
    assert len(curves) == 4
    assert peaks == [f"peak {x:.3g}" for x in result.peak_memory]


def test_microbatch_numbers_sit_inside_their_boxes():
    result = pipesched.simulate(pipesched.build_schedule("zb-h1", 4, 8))
    root = ET.fromstring(gantt_svg(result))
    rects = [(float(r.get("x")), float(r.get("width")), tooltip_action(r)) for r in boxes(gantt_svg(result))]
    numbers = [e for e in root.iter("{%s}text" % NS["s"]) if (e.get("class") or "").startswith("n")]
    assert numbers, "boxes this wide show their microbatch"
    for text in numbers:
        x = float(text.get("x"))
        inside = [a for left, w, a in rects if left <= x <= left + w and re.sub(r"^\d+[FIWB]", "", a) == text.text]
        assert inside, f"number {text.text} at x={x} is in no box of that microbatch"


def test_shared_scale_aligns_charts():
    """Charts drawn with one Scale put time t at the same x and end their axes together."""
    scale = Scale(px_per_unit=10, axis_end=40)
    for name in ("zb-v", "gpipe"):
        result = pipesched.simulate(pipesched.build_schedule(name, 4, 4))
        root = ET.fromstring(gantt_svg(result, scale))
        axis = next(e for e in root.iter("{%s}line" % NS["s"]) if e.get("class") == "axis")
        assert (float(axis.get("x1")), float(axis.get("x2"))) == (LABEL_W, LABEL_W + 400)
        first = min(boxes(gantt_svg(result, scale)), key=lambda r: float(r.get("x")))
        assert float(first.get("x")) == LABEL_W  # rank 0 starts at time 0


def test_large_chart_stays_small():
    result = pipesched.simulate(pipesched.build_schedule("zb-v", 32, 256))
    svg = gantt_svg(result)
    assert len(result.schedule) == 49152
    assert len(svg.encode()) < 10 * 1024 * 1024


def test_measured_timeline_draws_without_a_memory_strip():
    from pipesched.actions import Action
    from pipesched.execution import Span
    from pipesched.render.timeline import Timeline

    spans = ((Span(Action(0, "F", 0), 0.0, 0.5), Span(Action(0, "B", 0), 1.5, 2.5)),
             (Span(Action(1, "F", 0), 0.5, 1.0), Span(Action(1, "B", 0), 1.0, 1.5)))
    svg = gantt_svg(Timeline(spans, placement=(0, 1), name="measured", unit="s"))
    root = ET.fromstring(svg)
    assert sorted(tooltip_action(r) for r in boxes(svg)) == ["0B0", "0F0", "1B0", "1F0"]
    assert not [e for e in root.iter("{%s}path" % NS["s"]) if e.get("class") == "mem"]
    assert "time (s)" in svg and "peak memory" not in svg
