"""The schedule families by name, and ``build_schedule``, the one entry point that builds them.

A family is one module with a builder ``build(request: BuildRequest) -> Schedule`` and one
:func:`register` call with what everything else needs to know about it: when to use it (the
``list`` table), its chunks and placement, its memory, how the advisor explains it, whether
zb-auto starts from it, and its torch.distributed.pipelining counterpart. Nothing else names a
family: ``list``, ``compare``, ``advise``, zb-auto and the torch interop read the registry (see
docs/extending.md).
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from typing import Callable, Iterable, Optional

from .collector import collector_paused
from .costs import UNIT, Costs, as_costs
from .errors import ConfigError, UnknownScheduleError
from .execution import TOLERANCE
from .planning import check_schedule_size
from .ranking import check_objective
from .schedule import Schedule
from .schedules import greedy, v_blocks, v_compact, v_family
from .simulate import unit_peaks
from .validate import validate


def single_candidate(ranks: int, microbatches: int) -> int:
    """The search width of a family that builds its schedule directly: one candidate."""
    return 1


def no_recompute_search(ranks: int, memory_limit: float) -> int:
    """The extra width of a family that never searches recomputation: none."""
    return 0


def always_searches(ranks: int, costs: Costs, memory_limit: Optional[float]) -> bool:
    """A family whose search width counts whatever the costs (the planning bound's default)."""
    return True


class Placement(str, Enum):
    """Where a family puts its stages (:mod:`pipesched.placement` builds the maps)."""

    LOOP = "loop"  # stage s on rank s % p (one chunk, or Megatron's interleaving)
    V = "v"  # two chunks per rank, down the ranks and back up
    SEARCHED = "loop or v"  # the builder picks one per request (zb-auto)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class BuildRequest:
    """What a builder is asked for; a builder reads what it needs and ignores the rest.

    ``chunks`` is already checked against the family's range (None only for a family that
    searches its chunk count); ``memory_limit`` is activations per rank in M_B (None: the
    family's own default); ``objective`` steers the families that search (``uses_objective``).
    """

    ranks: int
    microbatches: int
    chunks: Optional[int] = None
    costs: Costs = UNIT
    memory_limit: Optional[float] = None
    objective: str = "makespan"
    recompute_input: Optional[float] = None  # what a recomputed stage keeps, of its activations (zb-auto)


@dataclass(frozen=True)
class TorchCounterpart:
    """The torch.distributed.pipelining schedule class that does what a family does."""

    class_name: str
    chunks: Optional[int] = None  # stages per rank torch requires (None: any)


@dataclass(frozen=True)
class ZbAutoCandidate:
    """How a family seeds zb-auto's search (zb-auto keeps the best of all seeds and its greedy).

    ``order``: position among the seeds; an earlier seed wins ties. ``programs``: the schedules
    it offers, each with the origin zb-auto reports; None offers the family's own build at
    zb-auto's memory limit (when the family honours limits) and default chunks. A family may
    offer several seeds at different positions (a tuple).
    """

    order: int
    programs: Optional[Callable[[BuildRequest], Iterable[tuple[str, Schedule]]]] = None
    width: int = 1  # schedules ``programs`` builds and simulates (the planning bound counts them)


@dataclass(frozen=True)
class Family:
    """A registered schedule family."""

    name: str
    build: Callable[[BuildRequest], Schedule]
    summary: str  # when to use it, one line
    placement: Placement
    split_backward: bool
    default_chunks: int
    min_chunks: int
    max_chunks: Optional[int]  # None: no upper bound
    memory: str  # peak activations, in words
    uses_memory_limit: bool = False  # True when memory_limit steers the construction
    uses_objective: bool = False  # True when the objective steers the construction
    searches_chunks: bool = False  # True: chunks=None reaches the builder, which tries every count
    parameter_copies: int = 1  # model copies each rank holds (DualPipe: 2)
    # how many candidate schedules build() makes and simulates for (ranks, microbatches), at most;
    # a family that searches_chunks takes a third argument, the chunks asked (None: it searches them)
    search_width: Callable[..., int] = single_candidate
    # how many more it simulates when the request searches recomputation (a memory limit and a
    # recompute_input) for (ranks, memory_limit); counted only for such requests
    recompute_search_width: Callable[[int, float], int] = no_recompute_search
    # how it builds, for the planning bound's CPU time per action (a key of
    # pipesched.planning.SECONDS_PER_ACTION): "construction", "search", "auto" or "greedy"
    planning: str = "construction"
    # False when the request alone shows the family builds one schedule, no search, for
    # (ranks, costs, memory_limit): zb-v's program is optimal at equal costs within p M_B
    searches_for: Callable[[int, Costs, Optional[float]], bool] = always_searches
    why: str = ""  # the advisor's reason: what it removes and costs ({v} chunks, {msg} messages, {p} ranks)
    chunks_hint: str = ""  # appended to the error for a chunk count out of range
    torch: Optional[TorchCounterpart] = None
    zb_auto: ZbAutoCandidate | tuple[ZbAutoCandidate, ...] = ()  # () : not a zb-auto seed

    def __post_init__(self) -> None:
        object.__setattr__(self, "placement", Placement(self.placement))
        if isinstance(self.zb_auto, ZbAutoCandidate):
            object.__setattr__(self, "zb_auto", (self.zb_auto,))

    def chunks_text(self) -> str:
        if self.searches_chunks:
            return f"chunks {self.min_chunks}..{self.max_chunks} (default: searched)"
        if self.max_chunks == self.min_chunks:
            return f"chunks={self.min_chunks}"
        if self.max_chunks is None:
            return f"chunks>={self.min_chunks} (default {self.default_chunks})"
        return f"chunks {self.min_chunks}..{self.max_chunks} (default {self.default_chunks})"

    def resolve_chunks(self, chunks: Optional[int]) -> Optional[int]:
        if chunks is None:
            return None if self.searches_chunks else self.default_chunks
        _check_int("chunks", chunks)
        if chunks < self.min_chunks or (self.max_chunks is not None and chunks > self.max_chunks):
            hint = f" ({self.chunks_hint})" if self.chunks_hint else ""
            raise ConfigError(f"{self.name} needs {self.chunks_text()}, got chunks={chunks}{hint}")
        return chunks


_FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Add a family to the registry (names are unique)."""
    if family.name in _FAMILIES:
        raise ValueError(f"schedule {family.name!r} is registered twice")
    _FAMILIES[family.name] = family
    return family


def unregister(name: str) -> Family:
    """Remove a family (a plug-in's or a test's) and return it."""
    return _FAMILIES.pop(name)


def families() -> list[Family]:
    """Every registered family, in registration order (the built-in ones, registered when
    :mod:`pipesched` is imported, simplest first)."""
    return list(_FAMILIES.values())


def schedule_names() -> list[str]:
    return [f.name for f in families()]


def get_family(name: str) -> Family:
    """The family called ``name``; an unknown name suggests the closest ones."""
    if not isinstance(name, str):
        raise UnknownScheduleError(f"a schedule name is text such as 'zb-v' (pipesched list), got {name!r:.60}")
    key = name.strip().lower()
    if key in _FAMILIES:
        return _FAMILIES[key]
    close = difflib.get_close_matches(key, list(_FAMILIES), n=3, cutoff=0.4)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise UnknownScheduleError(
        f"unknown schedule {name!r}{hint} (known: {', '.join(_FAMILIES)})"
    )


def _check_int(label: str, value: object, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{label} must be a whole number, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{label} must be at least {minimum}, got {value}")


@lru_cache(maxsize=6)  # zb-auto's one-chunk seeds: the four families built just before it
def built(family: Family, request: BuildRequest) -> Schedule:
    """``family.build(request)``, kept for the last few requests: a builder is a function of its
    request, and one search asks for the same build several times (zb-auto seeds itself with
    the families the search has just built; a family steered over a limit is built again as it
    comes). The schedule is immutable, so sharing it also shares its lowered programs and runs."""
    return family.build(request)


def forget_builds() -> None:
    """Empty every memoized build (:func:`built`, the greedy's and the V programs'), so that the
    next request is built again: for whoever times a build (a benchmark's repeats)."""
    for cached in (built, greedy.memoized, v_compact.compacted_orders, v_blocks.block_orders, v_family.v_programs):
        cached.cache_clear()


@collector_paused()
def build_schedule(
    name: str,
    ranks: int,
    microbatches: int,
    chunks: Optional[int] = None,
    costs: Optional[Costs] = None,
    memory_limit: Optional[float] = None,
    objective: Optional[str] = None,
    recompute_input: Optional[float] = None,
) -> Schedule:
    """Build, validate and return the schedule ``name`` for ``ranks`` ranks and ``microbatches``.

    ``chunks`` is the number of stages per rank (families that fix it accept only that value);
    ``costs`` steer the cost-aware choices; ``memory_limit`` (activations per rank, in one
    microbatch's activations for the rank's share) caps peak memory: families that can trade
    speed for memory honour it, the others raise if they need more. ``objective``
    (``"makespan"``, the default, or ``"span"``) steers the families that search
    (``uses_objective``); the others ignore it. ``recompute_input`` (what a recomputed stage
    keeps, as a share of its activations) lets zb-auto recompute on some stages to meet
    ``memory_limit`` when that is faster (the schedule's ``meta["recompute"]``); the others
    ignore it. Sizes that would take more than about a minute
    to plan raise a ConfigError that says what fits (:mod:`pipesched.planning`).
    """
    family = get_family(name)
    _check_int("ranks", ranks)
    _check_int("microbatches", microbatches)
    v = family.resolve_chunks(chunks)
    if memory_limit is not None:
        if isinstance(memory_limit, bool) or not isinstance(memory_limit, (int, float)) or not math.isfinite(memory_limit) or memory_limit <= 0:
            raise ConfigError(f"memory_limit must be a number above 0, got {memory_limit!r}")
    recompute_limit = memory_limit if recompute_input is not None else None  # recomputation searched
    check_schedule_size(family, ranks, microbatches, v, recompute_limit,  # refuse minutes of work up front
                        searches=family.searches_for(ranks, costs if costs is not None else UNIT, memory_limit))
    request = BuildRequest(
        ranks, microbatches, v, as_costs(costs), memory_limit,
        check_objective(objective) if objective is not None else "makespan", recompute_input,
    )
    schedule = built(family, request)
    validate(schedule)
    if memory_limit is not None:
        peak = peak_memory(schedule)
        if peak > memory_limit + TOLERANCE:
            raise ConfigError(
                f"{family.name} needs {peak:g} activations per rank at ranks={ranks} "
                f"microbatches={microbatches}, above memory_limit={memory_limit:g}; "
                "raise the limit or pick a leaner schedule (pipesched list shows each one's memory)"
            )
    return schedule


def peak_memory(schedule: Schedule) -> float:
    """Largest peak activations over ranks (order-only: no costs, no run needed)."""
    return max(unit_peaks(schedule))
