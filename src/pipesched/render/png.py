"""The Gantt chart as PNG, painted with Pillow from the same layout as the SVG (``[png]`` extra)."""

from __future__ import annotations

import io
from typing import Optional, Union

from ..errors import ConfigError
from ..simulate import SimResult
from .layout import LABEL_W, LEGEND_Y, ROW_H, Scale, build_chart
from .palette import palette, text_colour
from .timeline import Timeline, as_timeline

INSTALL_HINT = "PNG output needs Pillow: pip install 'pipesched[png]' (or write .svg, which needs nothing)"
ZOOM = 2  # pixels per layout unit, for a crisp raster (1 where that would pass MAX_PIXELS)
MAX_PIXELS = 40_000_000  # about 120 MB of RGB while painting: a larger chart is refused (SVG has no such cost)
LANE, MEM_FILL, MEM_LINE, PEAK, INK = "#ececec", "#ddd6ea", "#5e4b8b", "#cc0000", "#222222"


def gantt_png(source: Union[SimResult, Timeline], scale: Optional[Scale] = None) -> bytes:
    """PNG bytes of the chart; raises ConfigError (one line, with the install command) without Pillow."""
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
    timeline = as_timeline(source)
    chart = build_chart(timeline, scale)
    fills = palette(timeline.chunks, timeline.comm is not None)
    area = chart.width * chart.height
    if area > MAX_PIXELS:
        raise ConfigError(
            f"a PNG of this chart would be {chart.width:.0f} x {chart.height:.0f} px, more than "
            f"{MAX_PIXELS // 1_000_000} million pixels: write .svg instead"
        )
    z = ZOOM if area * ZOOM * ZOOM <= MAX_PIXELS else 1
    image = Image.new("RGB", (int(chart.width * z) + 1, int(chart.height * z) + 1), "white")
    draw = ImageDraw.Draw(image)

    def font(size: float):
        return ImageFont.load_default(size=size * z)

    title_font, small, tiny = font(13), font(11), font(9)
    draw.text((8 * z, 17 * z), f"{chart.title}   {chart.subtitle}", fill=INK, font=title_font, anchor="ls")
    for x, key, words in chart.legend:
        if key:
            draw.rectangle([x * z, (LEGEND_Y - 5) * z, (x + 14) * z, (LEGEND_Y + 5) * z], fill=fills[key])
            draw.text(((x + 18) * z, LEGEND_Y * z), words, fill=INK, font=small, anchor="lm")
        else:
            draw.text((x * z, LEGEND_Y * z), words, fill="#555555", font=small, anchor="lm")
    for lane in chart.lanes:
        draw.text(((LABEL_W - 6) * z, (lane.y + ROW_H / 2) * z), lane.label, fill=INK, font=small, anchor="rm")
        draw.rectangle([LABEL_W * z, lane.y * z, chart.plot_x1 * z, (lane.y + ROW_H) * z], fill=LANE)
    number_font = font(10)
    for b in chart.boxes:
        fill = fills[b.style]
        draw.rectangle([b.x * z, b.y * z, (b.x + b.w) * z, (b.y + b.h) * z], fill=fill, outline="white", width=1)
        if b.label:
            draw.text(((b.x + b.w / 2) * z, (b.y + b.h / 2) * z), b.label,
                      fill=text_colour(fill), font=number_font, anchor="mm")
    for strip in chart.strips:
        points = [(x * z, y * z) for x, y in strip.points]
        base = points[0][1]
        draw.polygon(points + [(points[-1][0], base)], fill=MEM_FILL)
        draw.line(points, fill=MEM_LINE, width=1)
        px, py = strip.peak_x * z, strip.peak_y * z
        draw.ellipse([px - 2 * z, py - 2 * z, px + 2 * z, py + 2 * z], fill=PEAK)
        draw.text((px + 4 * z, py + 2 * z), f"peak {strip.peak_text}", fill=PEAK, font=tiny, anchor="lm")
    axis = chart.axis_y * z
    draw.line([(LABEL_W * z, axis), (chart.plot_x1 * z, axis)], fill="#888888", width=1)
    for x, label in chart.ticks:
        draw.line([(x * z, axis), (x * z, axis + 4 * z)], fill="#888888", width=1)
        draw.text((x * z, axis + 14 * z), label, fill="#444444", font=tiny, anchor="mm")
    draw.text((chart.plot_x1 * z, axis + 24 * z), f"time ({chart.unit})", fill="#444444", font=tiny, anchor="rm")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=False)
    return buffer.getvalue()
