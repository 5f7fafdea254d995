"""How long planning takes, and refusing sizes that would take more than about a minute.

Planning is pure Python: every schedule built holds one object per action, and validating and
simulating it visits each action a few times. The work therefore grows with the actions built:

    actions built = stages x microbatches x kinds (F+B, or F+I+W) x candidates

where ``candidates`` is how many schedules a searching family builds and simulates to pick one
(``Family.search_width``: 1 for the handcrafted families, about 40 for ``zb-auto`` at large sizes, where
a W re-placement counts as two schedules and the authors' heuristic as three; a compacted
V program counts as ``COMPACTION_COST`` schedules; a request that has zb-auto search recomputation
adds its recomputing candidates, ``Family.recompute_search_width``).

What one action built costs depends on how the family builds (``Family.planning``, a key of
:data:`SECONDS_PER_ACTION`): a construction writes each action once; a search over group sizes
and placements (interleaved, interleaved-zb) times each candidate; zb-auto simulates its seeds
and re-places their W passes; the V family's greedy list scheduler scans its ranks for every
action it places; zb-auto's exact refinement (a MILP, small instances only) is counted in its
search width. Those rates were measured in CPU seconds on this project's 2-core machine
(``python benchmarks/planning_rates.py``; benchmarks/RESULTS.md, "Planning bound in seconds",
re-measured in "The planning bound after the speed merges") and rounded up, so the time stated
is an upper estimate there (``planning_rates.py --check`` holds them to it);
tests/test_planning.py checks that they are in proportion to real builds on any machine. A
request predicted above :data:`MAX_PLANNING_SECONDS` is refused up front, in one line naming the
largest size that fits and its predicted time. One schedule also holds a few hundred bytes per
action: above :data:`MAX_ACTIONS_HELD` actions in one schedule (some GB) it is refused on memory
alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

from .errors import ConfigError
from .units import format_seconds

if TYPE_CHECKING:  # the registry asks this module before it builds: type names only
    from .registry import Family

SECONDS_PER_ACTION = {  # CPU seconds per action built: measured (see the module doc), rounded up
    # measured at 32x256 and 64x512 with planning_rates.py (skewed costs), then at the sizes named
    "construction": 5e-6,  # one pass, no search (1.4-3.5 us; 3.8 us for 1f1b at p = 256, m = 4096)
    "search": 2e-6,  # candidates ranked: interleaved's group sizes, interleaved-zb's fills (0.8-1.1 us)
    "auto": 6e-6,  # zb-auto's seeds, re-placements and, on small instances, its MILP (1.4-1.5 us; 2.5-3.9 us
    # at the 1T layout's p = 64, m = 512 under its limit; 7 us at 8x32, the MILP's fixed cost)
    "greedy": 9e-6,  # the V family's list scheduler and pool (3.3-4.1 us; 4.7-5.1 us in the 1T layout search)
}
MAX_PLANNING_SECONDS = 60.0  # predicted CPU time above which a request is refused
MAX_ACTIONS_HELD = 12_000_000  # actions in one schedule (about 4 GB held): refused above
MAX_ACTIONS_BUILT = 2_200_000  # actions in a schedule CSV read whole (1f1b at p=256, m=4096 fits)
SHOW_PROGRESS_FROM = 250_000  # actions built: a few seconds, worth a word on the terminal


def actions_per_schedule(family: Family, ranks: int, microbatches: int, chunks: Optional[int]) -> int:
    """Actions in one schedule of ``family``: stages x microbatches x kinds of pass."""
    v = chunks if chunks is not None else (family.max_chunks if family.searches_chunks else family.default_chunks)
    kinds = 3 if family.split_backward else 2
    return ranks * v * microbatches * kinds


def search_width(family: Family, ranks: int, microbatches: int, recompute_limit: Optional[float] = None,
                 chunks: Optional[int] = None) -> int:
    """Schedules ``family`` builds and simulates to plan one request: its search width (of a
    family that searches its chunk count, at ``chunks`` where the request names them), plus its
    recomputing candidates when the request searches recomputation under ``recompute_limit``."""
    width = family.search_width(ranks, microbatches, chunks) if family.searches_chunks else family.search_width(ranks, microbatches)
    return width if recompute_limit is None else width + family.recompute_search_width(ranks, recompute_limit)


def actions_built(family: Family, ranks: int, microbatches: int, chunks: Optional[int],
                  recompute_limit: Optional[float] = None) -> int:
    """Actions built (and simulated) to plan ``family``: one schedule's, times its candidates
    (``recompute_limit``: the memory limit of a request that searches recomputation)."""
    return actions_per_schedule(family, ranks, microbatches, chunks) * search_width(family, ranks, microbatches, recompute_limit, chunks)


def seconds_per_action(family: Family) -> float:
    """CPU seconds per action ``family`` builds; a family that names no kind of planning
    (a plug-in's) is charged the slowest rate."""
    return SECONDS_PER_ACTION.get(family.planning, max(SECONDS_PER_ACTION.values()))


def planning_seconds(family: Family, ranks: int, microbatches: int, chunks: Optional[int],
                     recompute_limit: Optional[float] = None) -> float:
    """Predicted CPU seconds to build and simulate ``family`` for this request."""
    return actions_built(family, ranks, microbatches, chunks, recompute_limit) * seconds_per_action(family)


def check_planning_time(what: str, ranks: int, microbatches: int, seconds_at: Callable[[int], float],
                        instead: str = "", held_at: Optional[Callable[[int], int]] = None) -> float:
    """Raise a ConfigError when planning ``what`` is predicted to take more than
    :data:`MAX_PLANNING_SECONDS`; ``seconds_at(m)`` is the predicted time at ``m`` microbatches
    (growing with ``m``), ``held_at(m)`` the actions of the largest schedule held at once.
    The message names the most microbatches that fit and their time, then ``instead``.
    Returns the predicted seconds."""
    def fits(m: int) -> bool:
        return seconds_at(m) <= MAX_PLANNING_SECONDS and (held_at is None or held_at(m) <= MAX_ACTIONS_HELD)

    seconds = seconds_at(microbatches)
    if fits(microbatches):
        return seconds
    largest = largest_fitting(fits, microbatches)
    smaller = (
        f"use {largest} microbatches or fewer (about {format_seconds(seconds_at(largest))})" if largest >= 1
        else f"use fewer ranks (even 1 microbatch is too much at ranks={ranks})"
    )
    if held_at is not None and held_at(microbatches) > MAX_ACTIONS_HELD:
        why = (f"would hold {_millions(held_at(microbatches))} actions in one schedule, more than the "
               f"{_millions(MAX_ACTIONS_HELD)} (a few GB) planning keeps in memory")
    else:
        why = (f"would take about {format_seconds(seconds)} of CPU to plan, more than the "
               f"{format_seconds(MAX_PLANNING_SECONDS)} allowed")
    raise ConfigError(f"{what} at ranks={ranks} microbatches={microbatches} {why}: {smaller}{instead}")


def check_schedule_size(family: Family, ranks: int, microbatches: int, chunks: Optional[int],
                        recompute_limit: Optional[float] = None, searches: bool = True) -> float:
    """:func:`check_planning_time` for one family (``build_schedule``'s guard); ``searches=False``:
    the request is known to build one schedule (``Family.searches_for``)."""
    searching = searches and search_width(family, ranks, microbatches, recompute_limit, chunks) > 1

    def seconds(m: int) -> float:
        if searching:
            return planning_seconds(family, ranks, m, chunks, recompute_limit)
        return actions_per_schedule(family, ranks, m, chunks) * seconds_per_action(family)

    instead = ", or a schedule built without a search (1f1b, zb-h1)" if searching else ""
    return check_planning_time(
        family.name, ranks, microbatches, seconds, instead,
        held_at=lambda m: actions_per_schedule(family, ranks, m, chunks),
    )


def largest_fitting(fits: Callable[[int], bool], upto: int) -> int:
    """The largest microbatch count below ``upto`` that fits (0 if none does); the work grows
    with the count, so a bisection finds it."""
    low, high = 0, upto - 1  # invariant: low fits (0 trivially), everything above high does not
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def _millions(n: int) -> str:
    return f"{n / 1e6:.3g}M"
