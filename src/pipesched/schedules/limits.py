"""Memory limits for the families that honour any limit: the default and the smallest one."""

from __future__ import annotations

import math
from typing import Optional

from ..errors import ConfigError
from ..execution import TOLERANCE

SMALLEST_LIMIT = 1.0  # one microbatch's activations: a rank must hold at least one


def resolve_limit(
    limit: Optional[float], default: float, family: str,
    smallest: float = SMALLEST_LIMIT, what: str = "one microbatch's activations",
) -> float:
    """``limit`` (or ``default``) as a float, or a one-line error naming the smallest feasible
    one (``smallest``, which is ``what``: lower when the family may recompute activations)."""
    if limit is None:
        return float(default)
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not math.isfinite(limit):
        raise ConfigError(f"memory_limit must be a finite number, got {limit!r}")
    if limit < smallest - TOLERANCE:
        raise ConfigError(
            f"memory_limit={limit:g} is below {what}, the least any {family} "
            f"schedule needs: the smallest feasible limit is {smallest:g}"
        )
    return float(limit)
