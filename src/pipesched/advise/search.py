"""The advisor: build and simulate every candidate, keep those within the memory limit, rank them.

Ranking: candidates that fit come first, best first by :func:`pipesched.ranking.rank_key`
(the objective: ``makespan``, the iteration time when the optimizer step synchronises ranks, or
``span``, the period when iterations overlap; then the other time, then peak memory); what is
still tied goes to fewer chunks (fewer messages), then the simpler family (registry order).
Candidates over the limit follow, leanest first. What is done for each setting (build, simulate,
recompute, other layer assignments) is :mod:`.evaluate`'s.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace
from typing import Callable, ContextManager, Optional, Sequence

from ..costs import Costs
from ..errors import ConfigError, PipeschedError
from ..memory import format_bytes
from ..planning import actions_built, actions_per_schedule, check_planning_time, planning_seconds
from ..ranking import BASELINE, OBJECTIVES, rank_key, significant
from ..registry import Family, families as registered_families
from .candidates import BatchPlan, Setting, batch_plan, settings
from .costmodel import CostModel, ScaledCosts
from .evaluate import Price, SteeredOverLimit, leanest, search_setting
from .explain import explain
from .parallel import default_workers, map_outcomes
from .result import Advice, Candidate

__all__ = ["Advice", "Candidate", "NoCandidateFitsError", "advise", "objective_option"]


DEFAULT_MAX_CHUNKS = 4  # chunks per rank tried at most, unless told


class NoCandidateFitsError(ConfigError):
    """No candidate's peak memory is within the limit (the message names the smallest feasible);
    ``candidates``: every one built, leanest first; ``skipped``: the settings not built, with why."""

    def __init__(self, message: str, candidates: tuple = (), skipped: tuple = ()) -> None:
        super().__init__(message)
        self.candidates = candidates
        self.skipped = skipped


def advise(
    ranks: int,
    memory_limit: Optional[float] = None,
    *,
    microbatches: Optional[int] = None,
    global_batch: Optional[int] = None,
    microbatch_size: Optional[int] = None,
    costs: Optional[Costs] = None,
    cost_model: Optional[CostModel] = None,
    objective: str = "makespan",
    max_chunks: int = DEFAULT_MAX_CHUNKS,
    min_microbatch_size: int = 1,
    max_microbatches: Optional[int] = None,
    overhead: float = 0.0,
    families: Optional[Sequence[Family]] = None,
    workers: Optional[int] = None,
    progress: Optional[Callable[[int], ContextManager]] = None,
    price: Optional[Price] = None,
    refuse_slow: bool = True,
) -> Advice:
    """Rank every schedule x chunk count (x microbatch count) for this setup; see the module doc.

    ``memory_limit`` is peak activations per rank in M_B units of the reference microbatch
    (``microbatch_size``, or the one ``microbatches`` gives). ``costs`` are per-microbatch at that
    size; ``cost_model`` replaces ``costs`` and ``memory_limit`` (e.g. a model description).
    ``workers``: processes for the builds (default: :func:`.parallel.default_workers`, the cores
    this process may use when there are 4 or more or the search is large, else one).
    ``progress(work)``: a context the search runs in, given the actions it builds (a spinner).
    Searches that would take more than about a minute raise a ConfigError (:mod:`..planning`);
    ``refuse_slow=False`` does not (the layout searches, which search every layout in full).
    ``price(candidate, result)``: see
    :func:`.evaluate.evaluate`.
    Raises :class:`NoCandidateFitsError` when nothing fits, naming the smallest feasible limit.
    """
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ConfigError(f"ranks must be a whole number of at least 1, got {ranks!r}")
    if objective not in OBJECTIVES:
        raise ConfigError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if isinstance(max_chunks, bool) or not isinstance(max_chunks, int) or max_chunks < 1:
        raise ConfigError(f"max chunks must be a whole number of at least 1, got {max_chunks!r}")
    plan = batch_plan(ranks, microbatches, global_batch, microbatch_size, min_microbatch_size, max_microbatches)
    if cost_model is None:
        cost_model = ScaledCosts(costs or Costs(), memory_limit, overhead)
    # the advisor's memory model holds one copy of the weights (not DualPipe's two)
    family_list = list(families) if families is not None else [
        f for f in registered_families() if f.parameter_copies == 1
    ]
    order = {f.name: i for i, f in enumerate(family_list)}

    built: list[Candidate] = []
    skipped: list[tuple[str, int, int, str]] = []
    over_limit: list[tuple[Setting, SteeredOverLimit]] = []  # families that could not get under the limit when steered
    # Kept in this order (ties in the ranking keep it); the workers take the heaviest first (map_outcomes).
    todo = sorted(settings(family_list, plan, max_chunks), key=lambda s: -s.microbatches * s.chunks)
    if refuse_slow:
        check_search_size(ranks, plan, family_list, max_chunks)
    work = search_actions(ranks, plan, family_list, max_chunks)
    predicted = {s: planning_seconds(s.family, ranks, s.microbatches, s.chunks) for s in todo}
    if workers is None:
        workers = default_workers(len(todo), sum(predicted.values()))
    with progress(work) if progress is not None else nullcontext():
        outcomes = map_outcomes(
            lambda setting: search_setting(setting, ranks, plan, cost_model, objective, price=price), todo,
            workers, [predicted[s] for s in todo], shared_programs,
        )
    seen: set[tuple[str, int, int, str]] = set()  # a family that picks its own chunks may repeat itself

    def keep(candidates: Sequence[Candidate]) -> None:
        for candidate in candidates:
            key = (candidate.schedule, candidate.chunks, candidate.microbatches, candidate.recompute)
            if key not in seen:
                seen.add(key)
                built.append(candidate)

    for setting, outcome in zip(todo, outcomes):
        if isinstance(outcome, PipeschedError):
            if isinstance(outcome, SteeredOverLimit):
                over_limit.append((setting, outcome))
            skipped.append((setting.family.name, setting.chunks, setting.microbatches, str(outcome)))
            continue
        keep(outcome)
    for _, steered in over_limit:  # over the limit storing activations: recomputing them may fit
        keep(steered.as_built)
    if not any(c.fits for c in built):  # what they need at least, for the smallest feasible limit
        floors = map_outcomes(lambda setting: leanest(setting, ranks, plan, cost_model, objective, price),
                              [s for s, _ in over_limit], workers, [predicted[s] for s, _ in over_limit])
        for floor in floors:
            if isinstance(floor, PipeschedError):
                raise floor
            keep(floor)
    if not built:
        reasons = "; ".join(f"{s} chunks={v} m={m}: {why}" for s, v, m, why in skipped[:3])
        raise ConfigError(f"no schedule could be built for ranks={ranks}: {reasons}")

    fits = sorted(
        (c for c in built if c.fits),
        key=lambda c: (rank_key(c.makespan, c.span, c.peak_memory_reference, objective), c.chunks, order[c.schedule]),
    )
    over = sorted(
        (c for c in built if not c.fits),
        key=lambda c: (significant(c.activation_bytes or 0.0), significant(c.peak_memory_reference),
                       order[c.schedule], c.value(objective)),
    )
    if not fits:
        raise NoCandidateFitsError(_no_fit_message(over, memory_limit, cost_model.limits_device_memory()), tuple(over),
                                   tuple(skipped))
    baseline = next(
        (c for c in built if c.schedule == BASELINE and c.microbatches == plan.reference and c.recompute == "none"),
        None
    )
    ranked = [_with_speedup(c, baseline, objective) for c in fits + over]
    baseline = _with_speedup(baseline, baseline, objective) if baseline else None
    advice = Advice(ranks, objective, memory_limit, plan, tuple(ranked), baseline, skipped=tuple(skipped),
                    searched=FULL_SEARCH, time_unit=getattr(cost_model, "time_unit", ""))
    reason, notes = explain(advice)
    return replace(advice, reason=reason, notes=tuple(notes))


def shared_programs(setting: Setting) -> Optional[tuple[int, int]]:
    """Settings that build the same V programs (memoized: :func:`pipesched.registry.forget_builds`),
    the V families' and zb-auto's (which seeds itself with them) at one chunk and microbatch count:
    one worker builds them in turn, each reusing what the first built, as in one process."""
    family = setting.family
    return (setting.chunks, setting.microbatches) if family.placement == "v" or family.searches_chunks else None


def check_search_size(ranks: int, plan: BatchPlan, family_list: Sequence[Family], max_chunks: int) -> float:
    """The search's predicted CPU seconds (see :mod:`..planning`); a ConfigError naming what
    fits when that is more than about a minute."""
    todo = settings(family_list, plan, max_chunks)
    return check_planning_time(
        "advise", ranks, max(plan.options),
        lambda m: sum(planning_seconds(s.family, ranks, min(s.microbatches, m), s.chunks) for s in todo),
        instead=" (--microbatches, or --max-microbatches with --global-batch), fewer --schedules or a lower --max-chunks",
        held_at=lambda m: max(actions_per_schedule(s.family, ranks, min(s.microbatches, m), s.chunks) for s in todo),
    )


FULL_SEARCH = "in full"


def search_actions(ranks: int, plan: BatchPlan, family_list: Sequence[Family], max_chunks: int) -> int:
    """Actions the search builds and simulates (what its progress line counts)."""
    return sum(actions_built(s.family, ranks, s.microbatches, s.chunks) for s in settings(family_list, plan, max_chunks))


def objective_option(family: Family, objective: str) -> dict:
    """``objective=`` for ``build_schedule`` where the family searches by it, else nothing."""
    return {"objective": objective} if family.uses_objective else {}


def _with_speedup(c: Candidate, baseline: Optional[Candidate], objective: str) -> Candidate:
    if baseline is None:
        return c
    return replace(c, speedup_vs_1f1b=baseline.value(objective) / c.value(objective))


def _no_fit_message(over: Sequence[Candidate], limit: Optional[float], device: bool) -> str:
    """Name the leanest candidate: what it needs is the smallest feasible limit."""
    if not device and over[0].activation_bytes is not None:
        leanest = min(over, key=lambda c: c.activation_bytes)
        return (
            f"no schedule fits the memory limit: the leanest, {leanest.label()}, needs "
            f"{format_bytes(leanest.activation_bytes)} of activations on its fullest rank"
        )
    if device and over[0].peak_memory_bytes is not None:
        leanest = min(over, key=lambda c: c.peak_memory_bytes)
        return (
            f"no schedule fits in the memory limit: the leanest, {leanest.label()}, needs "
            f"{format_bytes(leanest.peak_memory_bytes)} ({leanest.peak_memory_bytes / 1e9:.3g} GB) on its fullest "
            f"rank, weights, gradients and optimizer state with {format_bytes(leanest.activation_bytes)} of "
            "activations; give a larger limit, more ranks or a smaller microbatch"
        )
    leanest = over[0]
    given = f" {limit:g}" if limit is not None else ""
    return (
        f"no schedule fits memory limit{given}: the smallest feasible limit is "
        f"{leanest.peak_memory_reference:.4g}, reached by {leanest.label()}"
    )
