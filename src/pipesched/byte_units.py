"""Sizes in bytes as people write them: ``40GiB`` read (:func:`parse_size`) and written
(:func:`format_bytes`); :mod:`pipesched.memory` re-exports both, where its callers look."""

from __future__ import annotations

from typing import Optional

BYTE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
              "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str) -> Optional[float]:
    """Bytes in ``text`` when it carries a unit (``40GiB``, ``512MiB``, ``1.5GB``, ``100B``);
    None when it is a plain number (an M_B count). Raises ValueError naming the valid units."""
    raw = text.strip()
    number = raw.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ").strip()
    unit = raw[len(number):].strip() if number != raw else ""
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{text!r} is not a size: give a number of M_B or bytes with a unit, e.g. 40GiB, 512MiB") from None
    if not unit:
        return None
    factor = BYTE_UNITS.get(unit.lower())
    if factor is None:
        raise ValueError(f"{text!r}: unknown unit {unit!r}; use one of B, KB, MB, GB, TB, KiB, MiB, GiB, TiB")
    return value * factor


def format_bytes(value: float) -> str:
    """Bytes in binary units, three significant digits (``1.25 GiB``)."""
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {unit}"
    return f"{value:.0f} B"
