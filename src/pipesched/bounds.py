"""The ranges of the numbers pipesched takes, and the one check that refuses a number outside its range.

A value the planner cannot use (``1e308`` costs overflow to ``inf``, ``nan`` compares false to
everything, ``2**63`` workers fork until memory runs out) is refused where it enters, in one
line that names the range, rather than failing later or running without end.
"""

from __future__ import annotations

from .errors import ConfigError

MAX_TIMEOUT_S = 365 * 24 * 3600  # a wait for a peer: a year at most (what torch's timedelta holds, with room)
DEFAULT_TIMEOUT_S = 300.0  # how long a rank waits for a peer or a collective unless told: every default reads this


def check_number(label: str, value: object, low: float, high: float, *, whole: bool = False) -> None:
    """Raise ConfigError unless ``value`` is a number (a whole one if ``whole``) from ``low`` to
    ``high``; ``nan`` and booleans never are."""
    kind_ok = isinstance(value, int) if whole else isinstance(value, (int, float))
    if isinstance(value, bool) or not kind_ok or not low <= value <= high:
        span = f"a whole number from {low} to {high}" if whole else f"a finite number from {low:g} to {high:g}"
        raise ConfigError(f"{label} must be {span}, got {value!r}")


def number_list(flag: str, text: str, example: str = "numbers such as 0.5 or 0.5,1") -> tuple[float, ...]:
    """``flag``'s comma-separated numbers (one line naming ``flag`` if they are not; ranges are the caller's)."""
    if not text.strip():
        raise ConfigError(f"{flag} is empty: give {example}, or leave the flag out")
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: expected numbers separated by commas") from None
    return values
