"""Colours for the four action kinds, from the Okabe-Ito palette (safe for colour-blind readers).

A schedule with several chunks per rank draws chunk 0 in the full colour and later chunks in
lighter shades of it, so the kind stays recognisable and the chunk can still be told apart.
"""

from __future__ import annotations

from ..ops import Op

BASE = {Op.F: "#0072B2", Op.I: "#E69F00", Op.W: "#009E73", Op.B: "#D55E00"}
KIND_NAMES = {Op.F: "forward", Op.I: "input grad", Op.W: "weight grad", Op.B: "full backward"}
LIGHTEST = 0.6  # how far the last chunk's shade moves towards white
COMM = {"AG": "#56B4E9", "RS": "#CC79A7"}  # the comm lane's collectives (Okabe-Ito sky blue, reddish purple)
COMM_NAMES = {"AG": "all-gather", "RS": "gradient reduction"}


def style_key(kind: Op, chunk: int) -> str:
    """The name of one kind-and-chunk colour (also the SVG's CSS class)."""
    return f"{kind}{chunk}"


def box_colour(kind: Op, chunk: int, chunks: int) -> str:
    """Fill colour of a box: the kind's colour, lighter for later chunks."""
    base = BASE[kind]
    if chunks <= 1 or chunk <= 0:
        return base
    return _towards_white(base, LIGHTEST * min(chunk, chunks - 1) / (chunks - 1))


def text_colour(fill: str) -> str:
    """Black or white, whichever reads better on ``fill``."""
    r, g, b = _rgb(fill)
    luminance = 0.2126 * _linear(r) + 0.7152 * _linear(g) + 0.0722 * _linear(b)
    return "#000000" if luminance > 0.22 else "#ffffff"


def palette(chunks: int, comm: bool = False) -> dict[str, str]:
    """Every style key a chart with ``chunks`` chunks per rank (and a comm lane) can use, with its fill."""
    kinds = {style_key(k, c): box_colour(k, c, chunks) for k in BASE for c in range(max(1, chunks))}
    return {**kinds, **COMM} if comm else kinds


def _rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def _linear(channel: int) -> float:
    c = channel / 255
    return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4


def _towards_white(colour: str, fraction: float) -> str:
    r, g, b = (round(c + (255 - c) * fraction) for c in _rgb(colour))
    return f"#{r:02x}{g:02x}{b:02x}"
