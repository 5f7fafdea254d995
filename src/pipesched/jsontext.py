"""JSON text for programs, always strict: no ``Infinity`` or ``NaN`` (which strict parsers refuse).

Bounded inputs keep every number finite; should one still not be (a metric of an empty run),
it is written as ``null``, never as a token that only Python's and JavaScript's parsers read.
"""

from __future__ import annotations

import json
import math
from typing import Any


def json_text(data: Any, **options: Any) -> str:
    """``json.dumps(data, **options)`` with non-finite floats as ``null`` and ``allow_nan=False``."""
    return json.dumps(_finite(data), allow_nan=False, **options)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value
