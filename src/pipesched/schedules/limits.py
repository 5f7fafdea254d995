"""Memory limits for the families that honour any limit: the default and the smallest one."""

from __future__ import annotations

import math
from typing import Optional

from ..errors import ConfigError
from ..execution import TOLERANCE

SMALLEST_LIMIT = 1.0  # one microbatch's activations: a rank must hold at least one


def resolve_limit(limit: Optional[float], default: float, family: str) -> float:
    """``limit`` (or ``default``) as a float, or a one-line error naming the smallest feasible one."""
    if limit is None:
        return float(default)
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not math.isfinite(limit):
        raise ConfigError(f"memory_limit must be a finite number, got {limit!r}")
    if limit < SMALLEST_LIMIT - TOLERANCE:
        raise ConfigError(
            f"memory_limit={limit:g} is below one microbatch's activations, the least any {family} "
            f"schedule needs: the smallest feasible limit is {SMALLEST_LIMIT:g}"
        )
    return float(limit)
