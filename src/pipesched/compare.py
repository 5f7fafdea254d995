"""Every registered schedule for one configuration, simulated side by side.

Shared by ``pipesched compare`` (the table), ``pipesched report`` (the charts) and whatever
else ranks schedules: a family that cannot be built for the configuration becomes an outcome
with the reason instead of a result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .costs import Costs
from .errors import PipeschedError
from .execution import TOLERANCE
from .planning import actions_built, actions_per_schedule, check_planning_time, planning_seconds
from .ranking import BASELINE
from .registry import Family, build_schedule, families
from .simulate import SimResult, simulate


@dataclass(frozen=True)
class Outcome:
    """One family's simulation (``result``), or why it could not be built (``error``)."""

    family: Family
    chunks: int
    result: Optional[SimResult] = None
    error: Optional[str] = None
    fits: bool = True  # peak memory within the memory limit
    speedup_vs_1f1b: Optional[float] = None  # 1f1b's makespan over this one's

    def row(self) -> dict:
        """Plain numbers, as ``compare --json`` prints them."""
        if self.result is None:
            return {"schedule": self.family.name, "chunks": self.chunks, "error": self.error}
        row = {**self.result.metrics(), "schedule": self.family.name, "fits": self.fits}
        if self.speedup_vs_1f1b is not None:
            row["speedup_vs_1f1b"] = self.speedup_vs_1f1b
        return row


def simulate_all(
    ranks: int,
    microbatches: int,
    chunks: Optional[int],
    costs: Costs,
    memory_limit: Optional[float] = None,
    objective: Optional[str] = None,
    recompute_input: Optional[float] = None,
) -> list[Outcome]:
    """Build and simulate every family; ``chunks`` applies where a family accepts it (elsewhere
    the family's default, or its own search); ``objective`` steers the families that search;
    ``recompute_input`` (with ``memory_limit``) lets zb-auto recompute where that is faster.
    Sizes that would take more than about a minute raise a ConfigError (:mod:`.planning`)."""
    recompute_limit = memory_limit if recompute_input is not None else None
    check_size(ranks, microbatches, chunks, recompute_limit)
    outcomes = []
    for family, v in _chosen_chunks(chunks):
        limit = memory_limit if family.uses_memory_limit else None
        try:
            schedule = build_schedule(family.name, ranks, microbatches, v, costs, limit, objective,
                                      recompute_input if limit is not None else None)
            result = simulate(schedule, costs)
        except PipeschedError as err:
            outcomes.append(Outcome(family, v or family.default_chunks, error=str(err)))
            continue
        fits = memory_limit is None or result.max_peak_memory <= memory_limit + TOLERANCE
        outcomes.append(Outcome(family, schedule.chunks, result, fits=fits))
    base = next((o.result for o in outcomes if o.family.name == BASELINE and o.result), None)
    if base is None:
        return outcomes
    return [
        Outcome(o.family, o.chunks, o.result, o.error, o.fits, base.makespan / o.result.makespan)
        if o.result else o
        for o in outcomes
    ]


def check_size(ranks: int, microbatches: int, chunks: Optional[int], recompute_limit: Optional[float] = None) -> float:
    """The predicted CPU seconds of :func:`simulate_all`; a ConfigError naming what fits when
    that is more than about a minute (:mod:`.planning`)."""
    return check_planning_time(
        "every schedule", ranks, microbatches,
        lambda m: sum(planning_seconds(f, ranks, m, v, recompute_limit) for f, v in _chosen_chunks(chunks)),
        instead=", or one schedule at a time (pipesched simulate NAME)",
        held_at=lambda m: max(actions_per_schedule(f, ranks, m, v) for f, v in _chosen_chunks(chunks)),
    )


def planned_work(ranks: int, microbatches: int, chunks: Optional[int], recompute_limit: Optional[float] = None) -> int:
    """Actions :func:`simulate_all` builds (see :mod:`.planning`; ``recompute_limit``: the memory
    limit when zb-auto searches recomputation)."""
    return sum(actions_built(family, ranks, microbatches, v, recompute_limit) for family, v in _chosen_chunks(chunks))


def _chosen_chunks(chunks: Optional[int]) -> list[tuple[Family, Optional[int]]]:
    """Each family with ``chunks`` where it accepts them, else None (its default or search)."""
    return [(family, chunks if accepts_chunks(family, chunks) else None) for family in families()]


def accepts_chunks(family: Family, chunks: Optional[int]) -> bool:
    """True when ``family`` can be built with ``chunks`` chunks per rank."""
    if chunks is None:
        return False
    return chunks >= family.min_chunks and (family.max_chunks is None or chunks <= family.max_chunks)
