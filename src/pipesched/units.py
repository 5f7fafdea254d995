"""Numbers as people read them: times with a unit chosen to fit, plain values without exponents.

One place for how a duration or a cost-unit value is written, so that a table, a reason and an
error message say ``14.9 s`` and ``812 ms`` alike, and never ``1.49e+04 ms``.
"""

from __future__ import annotations

import math


def format_seconds(seconds: float) -> str:
    """A duration with a unit chosen to fit: ``812 ms``, ``14.9 s``, ``3.2 min``, ``2.5 h``."""
    if not math.isfinite(seconds):
        return f"{seconds} s"
    if abs(seconds) < 0.9995e-3 and seconds != 0:
        return f"{1e6 * seconds:.3g} us"
    if abs(seconds) < 0.9995:
        return f"{1e3 * seconds:.3g} ms"
    if abs(seconds) < 99.5:
        return f"{seconds:.3g} s"
    if abs(seconds) < 5940:
        return f"{seconds / 60:.2g} min" if abs(seconds) < 600 else f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.3g} h"


def format_number(x: float) -> str:
    """A value in cost units, without an exponent: ``1568``, ``14930``, ``0.1234``."""
    if not math.isfinite(x):
        return str(x)
    return f"{x:.0f}" if abs(x) >= 1e4 else f"{x:.4g}"


def format_time(value: float, unit: str = "") -> str:
    """``value`` in ``unit``: ``"ms"`` gets a unit chosen to fit (:func:`format_seconds`), cost
    units (``""``) a plain number (:func:`format_number`)."""
    return format_seconds(value / 1e3) if unit == "ms" else format_number(value)
