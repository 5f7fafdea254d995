"""How candidates are compared: the objectives, the baseline, and the one ranking rule.

Every place that chooses among schedules (a family's builder among its variants, zb-auto among
its candidates and swaps, the advisor among families) ranks with :func:`rank_key`: the
objective first (``makespan``: ranks synchronise at the optimizer step; ``span``: iterations
overlap), then the other of the two times, then peak memory, each compared to 10 significant
digits (:func:`significant`) so that float rounding never decides. What is still tied keeps
the candidates' order: callers list first what they would rather keep (the handcrafted
program, the simpler family).
"""

from __future__ import annotations

import math

from .errors import ConfigError

OBJECTIVES = ("makespan", "span")
BASELINE = "1f1b"  # the guide's default: what speed-ups are measured against


def check_objective(objective: str) -> str:
    """The objective name, or a ConfigError naming the valid ones."""
    if objective not in OBJECTIVES:
        raise ConfigError(f"objective {objective!r} is not known: use one of {', '.join(OBJECTIVES)}")
    return objective


def objective_value(result, objective: str) -> float:
    """``makespan`` (optimizer steps synchronise ranks) or ``span`` (iterations overlap)."""
    return result.makespan if objective == "makespan" else result.span


def significant(x: float) -> float:
    """``x`` rounded to 10 significant digits (what ranking compares: float noise is far below)."""
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, 9 - int(math.floor(math.log10(abs(x)))))


def rank_key(makespan: float, span: float, peak_memory: float, objective: str) -> tuple[float, float, float]:
    """The ranking rule (lower is better): objective, other time, peak memory."""
    main, other = (makespan, span) if objective == "makespan" else (span, makespan)
    return (significant(main), significant(other), significant(peak_memory))


def result_key(result, objective: str) -> tuple[float, float, float]:
    """:func:`rank_key` of a simulation result."""
    return rank_key(result.makespan, result.span, result.max_peak_memory, objective)
