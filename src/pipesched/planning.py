"""How much work planning takes, and refusing sizes that would take minutes and gigabytes.

Planning is pure Python: every schedule built holds one object per action, and validating and
simulating it visits each action a few times. The work therefore grows with the actions built:

    actions built = stages x microbatches x kinds (F+B, or F+I+W) x candidates

where ``candidates`` is how many schedules a searching family builds and simulates to pick one
(``Family.search_width``: 1 for the handcrafted families, about 30 for ``zb-auto`` at large sizes; a compacted
V program counts as ``COMPACTION_COST`` schedules; a request that has zb-auto search recomputation
adds its recomputing candidates, ``Family.recompute_search_width``). Measured on this project's shared 2-core
machine (benchmarks/RESULTS.md, "Reliability: bounded planning work"), one action built costs
about 7 to 27 microseconds of CPU and a few hundred bytes, so :data:`MAX_ACTIONS_BUILT` keeps a
command within about a minute and well under 2 GB. Larger requests are refused up front, in one
line that says what would fit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

from .errors import ConfigError

if TYPE_CHECKING:  # the registry asks this module before it builds: type names only
    from .registry import Family

MAX_ACTIONS_BUILT = 2_200_000  # 1f1b at p=256, m=4096 (2.1M) fits
SHOW_PROGRESS_FROM = 250_000  # actions built: a few seconds, worth a word on the terminal


def actions_per_schedule(family: Family, ranks: int, microbatches: int, chunks: Optional[int]) -> int:
    """Actions in one schedule of ``family``: stages x microbatches x kinds of pass."""
    v = chunks if chunks is not None else (family.max_chunks if family.searches_chunks else family.default_chunks)
    kinds = 3 if family.split_backward else 2
    return ranks * v * microbatches * kinds


def search_width(family: Family, ranks: int, microbatches: int, recompute_limit: Optional[float] = None) -> int:
    """Schedules ``family`` builds and simulates to plan one request: its search width, plus its
    recomputing candidates when the request searches recomputation under ``recompute_limit``."""
    width = family.search_width(ranks, microbatches)
    return width if recompute_limit is None else width + family.recompute_search_width(ranks, recompute_limit)


def actions_built(family: Family, ranks: int, microbatches: int, chunks: Optional[int],
                  recompute_limit: Optional[float] = None) -> int:
    """Actions built (and simulated) to plan ``family``: one schedule's, times its candidates
    (``recompute_limit``: the memory limit of a request that searches recomputation)."""
    return actions_per_schedule(family, ranks, microbatches, chunks) * search_width(family, ranks, microbatches, recompute_limit)


def check_planning_work(what: str, ranks: int, microbatches: int, work_at: Callable[[int], int], instead: str = "") -> int:
    """Raise a ConfigError when planning ``what`` would build more than :data:`MAX_ACTIONS_BUILT`
    actions; ``work_at(m)`` is the actions built at ``m`` microbatches (growing with ``m``).
    The message names the most microbatches that fit, then ``instead``. Returns the work."""
    work = work_at(microbatches)
    if work <= MAX_ACTIONS_BUILT:
        return work
    fits = largest_fitting(work_at, microbatches)
    smaller = (
        f"use {fits} microbatches or fewer" if fits >= 1
        else f"use fewer ranks (even 1 microbatch is too much at ranks={ranks})"
    )
    raise ConfigError(
        f"{what} at ranks={ranks} microbatches={microbatches} would build about "
        f"{_millions(work)} actions, more than the {_millions(MAX_ACTIONS_BUILT)} planned within "
        f"about a minute: {smaller}{instead}"
    )


def check_schedule_size(family: Family, ranks: int, microbatches: int, chunks: Optional[int],
                        recompute_limit: Optional[float] = None) -> int:
    """:func:`check_planning_work` for one family (``build_schedule``'s guard)."""
    searching = search_width(family, ranks, microbatches, recompute_limit) > 1
    instead = ", or a schedule built without a search (1f1b, zb-h1)" if searching else ""
    return check_planning_work(
        family.name, ranks, microbatches, lambda m: actions_built(family, ranks, m, chunks, recompute_limit), instead
    )


def largest_fitting(work_at: Callable[[int], int], upto: int) -> int:
    """The largest microbatch count below ``upto`` whose work fits (0 if none does); the work
    grows with the count, so a bisection finds it."""
    low, high = 0, upto - 1  # invariant: low fits (0 trivially), everything above high does not
    while low < high:
        mid = (low + high + 1) // 2
        if work_at(mid) <= MAX_ACTIONS_BUILT:
            low = mid
        else:
            high = mid - 1
    return low


def _millions(n: int) -> str:
    return f"{n / 1e6:.3g}M"
