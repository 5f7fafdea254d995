"""The schedule families by name, and ``build_schedule``, the one entry point that builds them.

Each family is a pure builder ``build(ranks, microbatches, chunks, costs, memory_limit)`` plus
what a user needs to choose it: when to use it, what it needs, what it costs in memory.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Callable, Optional

from .costs import UNIT, Costs
from .errors import ConfigError, UnknownScheduleError
from .execution import TOLERANCE
from .ranking import check_objective
from .schedule import Schedule
from .validate import validate


def single_candidate(ranks: int, microbatches: int) -> int:
    """The search width of a family that builds its schedule directly: one candidate."""
    return 1


@dataclass(frozen=True)
class Family:
    """A registered schedule family."""

    name: str
    build: Callable[..., Schedule]
    summary: str  # when to use it, one line
    placement: str  # "loop" or "v"
    split_backward: bool
    default_chunks: int
    min_chunks: int
    max_chunks: Optional[int]  # None: no upper bound
    memory: str  # peak activations, in words
    torch_name: Optional[str] = None  # the torch.distributed.pipelining counterpart
    uses_memory_limit: bool = False  # True when memory_limit steers the construction
    uses_objective: bool = False  # True when build() takes objective="makespan"|"span"
    searches_chunks: bool = False  # True: chunks=None reaches build(), which tries every count
    parameter_copies: int = 1  # model copies each rank holds (DualPipe: 2; the runtime runs 1)
    # how many candidate schedules build() makes and simulates for (ranks, microbatches), at most
    search_width: Callable[[int, int], int] = single_candidate

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
            hint = {
                "1f1b": " (with chunks>=2 use interleaved-1f1b)",
                "interleaved-1f1b": " (chunks=1 is plain 1f1b)",
                "interleaved-zb": " (chunks=1 is zb-h1)",
            }.get(self.name, "")
            raise ConfigError(f"{self.name} needs {self.chunks_text()}, got chunks={chunks}{hint}")
        return chunks


_FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Add a family to the registry (names are unique)."""
    if family.name in _FAMILIES:
        raise ValueError(f"schedule {family.name!r} is registered twice")
    _FAMILIES[family.name] = family
    return family


def families() -> list[Family]:
    """Every registered family, in registration order (simplest first)."""
    _load_builtin()
    return list(_FAMILIES.values())


def schedule_names() -> list[str]:
    return [f.name for f in families()]


def get_family(name: str) -> Family:
    """The family called ``name``; an unknown name suggests the closest ones."""
    _load_builtin()
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


def build_schedule(
    name: str,
    ranks: int,
    microbatches: int,
    chunks: Optional[int] = None,
    costs: Optional[Costs] = None,
    memory_limit: Optional[float] = None,
    objective: Optional[str] = None,
) -> Schedule:
    """Build, validate and return the schedule ``name`` for ``ranks`` ranks and ``microbatches``.

    ``chunks`` is the number of stages per rank (families that fix it accept only that value);
    ``costs`` steer the cost-aware choices; ``memory_limit`` (activations per rank, in one
    microbatch's activations for the rank's share) caps peak memory: families that can trade
    speed for memory honour it, the others raise if they need more. ``objective``
    (``"makespan"`` or ``"span"``) steers the families that search (``uses_objective``); the
    others ignore it. Sizes that would take more than about a minute to plan raise a ConfigError
    that says what fits (:mod:`pipesched.planning`).
    """
    family = get_family(name)
    _check_int("ranks", ranks)
    _check_int("microbatches", microbatches)
    v = family.resolve_chunks(chunks)
    costs = costs if costs is not None else UNIT
    if memory_limit is not None:
        if isinstance(memory_limit, bool) or not isinstance(memory_limit, (int, float)) or not math.isfinite(memory_limit) or memory_limit <= 0:
            raise ConfigError(f"memory_limit must be a number above 0, got {memory_limit!r}")
    extra = {}
    if objective is not None:
        check_objective(objective)
        if family.uses_objective:
            extra["objective"] = objective
    from .planning import check_schedule_size

    check_schedule_size(family, ranks, microbatches, v)  # refuse minutes of work up front
    schedule = family.build(ranks, microbatches, chunks=v, costs=costs, memory_limit=memory_limit, **extra)
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
    """Largest peak activations over ranks (order-only: no costs needed)."""
    from .simulate import simulate

    return simulate(schedule).max_peak_memory


_LOADED = False


def _load_builtin() -> None:
    global _LOADED
    if not _LOADED:
        _LOADED = True
        from .schedules import builtin  # noqa: F401  (registers the built-in families)
