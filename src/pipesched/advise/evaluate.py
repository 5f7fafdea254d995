"""One setting of the advisor's search, built and simulated: the candidates it gives.

:mod:`.search` decides which settings (family x chunks x microbatches) to try, in which worker,
and ranks what comes back; this module is the work done for one setting: build it to the memory
limit where the family honours one, simulate it (with a limit in bytes, also with every stage
recomputing), and build it again under the model's other layer assignments where that is cheap.
Apart from the search so that each module has one job: choosing and ranking there, measuring here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional

from ..errors import ConfigError, PipeschedError
from ..execution import TOLERANCE
from ..ranking import rank_key
from ..registry import build_schedule
from ..schedule import Schedule
from ..simulate import SimResult, simulate
from .candidates import BatchPlan, Setting
from .costmodel import CostModel
from .result import Candidate

REBUILD_WIDTH = 10  # families building at most this many programs are built under every layer assignment


MEMORY_COUNTED = {  # what a candidate's bytes count: the whole footprint where the model knows it
    True: "weights, gradients, optimizer state and activations (with the stage inputs held)",
    False: "activations (with the stage inputs held); weights and optimizer state are not known from costs",
}


class SteeredOverLimit(ConfigError):
    """A family that honours memory limits could not get under this one; ``as_built``: what it
    gives built as it comes that fits (:func:`search_setting` fills it in; pickled with the error)."""

    as_built: tuple = ()


Price = Callable[[Candidate, SimResult], tuple]  # a candidate and its simulation -> Candidate.priced


def as_built(setting: Setting, ranks: int, plan: BatchPlan, model: CostModel, objective: str,
             price: Optional[Price] = None) -> list[Candidate]:
    """A family that could not be steered under the limit, built as it comes: where sizes are
    in bytes its recomputing variant may still fit (nothing when it cannot be built at all)."""
    try:
        return evaluate(setting, ranks, plan, model, objective, steer=False, price=price)
    except PipeschedError:
        return []


def search_setting(setting: Setting, ranks: int, plan: BatchPlan, model: CostModel, objective: str,
                   price: Optional[Price] = None) -> list[Candidate]:
    """The search's work for one setting, in its worker: :func:`evaluate`, and where the family
    cannot be steered under the limit, the fitting candidates of :func:`as_built` on the error
    it raises: the retry runs beside the other settings instead of after them, one by one."""
    try:
        return evaluate(setting, ranks, plan, model, objective, price=price)
    except SteeredOverLimit as err:
        err.as_built = tuple(c for c in as_built(setting, ranks, plan, model, objective, price) if c.fits)
        raise


def leanest(setting: Setting, ranks: int, plan: BatchPlan, model: CostModel, objective: str,
            price: Optional[Price] = None) -> list[Candidate]:
    """A family that honours limits, built to one microbatch's activations (the least any
    schedule holds), or as it comes when it cannot get that low."""
    try:
        return evaluate(setting, ranks, plan, model, objective, steer_to_floor=True, price=price)
    except PipeschedError:
        return evaluate(setting, ranks, plan, model, objective, steer=False, price=price)


def evaluate(
    setting: Setting, ranks: int, plan: BatchPlan, model: CostModel, objective: str,
    steer: bool = True, steer_to_floor: bool = False, price: Optional[Price] = None,
) -> list[Candidate]:
    """Build and simulate one setting; families that honour a limit are built to it when ``steer``.

    Under a limit in bytes (activation sizes known) the same schedule is also simulated with
    every stage recomputing its activations: slower (each backward re-runs its forward), leaner.

    Where a rank holds several stages and the model offers several ways to give them its layers
    (:meth:`CostModel.layer_assignments`), a family that builds few programs (``search_width``
    up to :data:`REBUILD_WIDTH`) is built under each one (what it builds, such as interleaved's
    microbatch group, may depend on the split) and for each recompute choice the faster is kept;
    a family that searches wider (the V family, zb-auto) is built once, under the model's own
    assignment: repeating its search per split would double the advisor's time. Every
    candidate returned was built and simulated under the one split it reports. ``price``, where
    given, is called with each candidate and its simulation (:attr:`Candidate.priced`).
    """
    schedule, steer_to = _build(setting, ranks, plan, model, objective, steer, steer_to_floor)
    options = model.layer_assignments(schedule.stages, schedule.style)
    if len(options) < 2:
        return _measure(setting, plan, model, objective, schedule, steer_to, None, price)
    best = _measure(setting, plan, model, objective, schedule, steer_to, options[0], price)
    if setting.family.search_width(ranks, setting.microbatches) > REBUILD_WIDTH:
        return best
    for name in options[1:]:
        other = model.with_layer_assignment(name)
        try:
            rebuilt, steer_other = _build(setting, ranks, plan, other, objective, steer, steer_to_floor)
        except PipeschedError:
            continue
        theirs = {c.recompute: c for c in _measure(setting, plan, other, objective, rebuilt, steer_other, name, price)}
        best = [min((c, theirs.get(c.recompute, c)), key=lambda x: _fit_then_time(x, objective)) for c in best]
    return best


def _fit_then_time(c: Candidate, objective: str) -> tuple:
    return (not c.fits, rank_key(c.makespan, c.span, c.peak_memory_reference, objective))


def _build(
    setting: Setting, ranks: int, plan: BatchPlan, model: CostModel, objective: str,
    steer: bool, steer_to_floor: bool,
) -> tuple[Schedule, Optional[float]]:
    """The setting's schedule under ``model``'s costs, and the limit it was built to."""
    family, v, m = setting.family, setting.chunks, setting.microbatches
    stages = ranks * v
    scale = plan.scale(m)
    costs = model.costs(stages, family.placement, scale)
    limit = model.memory_limit(stages, family.placement, scale)
    steer_to = limit if steer and family.uses_memory_limit and limit is not None else None
    if steer_to_floor:
        steer_to = 1.0
    try:
        schedule = build_schedule(family.name, ranks, m, v, costs, steer_to, objective)
    except PipeschedError as err:
        if steer_to is None:
            raise
        raise SteeredOverLimit(str(err)) from None
    if model.layers_per_stage(schedule.stages, schedule.style) != model.layers_per_stage(stages, family.placement):
        # the family chose a layout whose layer split differs from the one it was costed with:
        # cost it under that split and build again, so time and memory describe one split
        costs = model.costs(schedule.stages, schedule.style, scale)
        schedule = build_schedule(family.name, ranks, m, v, costs, steer_to, objective)
    return schedule, steer_to


def _measure(
    setting: Setting, plan: BatchPlan, model: CostModel, objective: str, schedule: Schedule,
    steer_to: Optional[float], assignment: Optional[str], price: Optional[Price] = None,
) -> list[Candidate]:
    """Simulate ``schedule`` under ``model``'s costs and memory: as it is and, with a limit in
    bytes, with every stage recomputing."""
    family, m = setting.family, setting.microbatches
    scale = plan.scale(m)
    costs = model.costs(schedule.stages, schedule.style, scale)
    if schedule.stages == schedule.ranks * setting.chunks:
        limit = model.memory_limit(schedule.stages, family.placement, scale)
    else:  # the family chose its own chunk count: hold it to that layout
        limit = model.memory_limit(schedule.stages, schedule.style, scale)
    sizes = model.stage_sizes(schedule.stages, schedule.style, scale)
    budgets = model.activation_budgets(schedule.stages, schedule.style) if sizes is not None else None
    variants = [frozenset()] + ([frozenset(range(schedule.stages))] if budgets is not None else [])
    out = []
    for stages_recomputed in variants:
        result = simulate(schedule, costs, sizes.with_recompute(stages_recomputed) if sizes is not None else None)
        peaks = result.peak_memory
        peak = max(peaks)
        fits = limit is None or peak <= limit + TOLERANCE
        memory_gb = model.memory_gb(schedule.stages, schedule.style, scale, tuple(peaks))
        peak_bytes = activation_bytes = counted = None
        if sizes is not None:
            held = result.peak_memory_bytes
            state = model.state_bytes(schedule.stages, schedule.style)
            peak_bytes = max(a + b for a, b in zip(held, state))
            activation_bytes = max(held)
            counted = MEMORY_COUNTED[any(state)]
            memory_gb = peak_bytes / 1e9 if memory_gb is not None else None
            if budgets is not None:
                fits = all(a <= b * (1 + TOLERANCE) for a, b in zip(held, budgets))
        candidate = Candidate(
            schedule=family.name,
            chunks=schedule.chunks,
            microbatches=m,
            microbatch_size=plan.size(m),
            memory_limit=steer_to,
            costs=costs,
            makespan=result.makespan,
            span=result.span,
            bubble_ratio=result.bubble_ratio,
            peak_memory=peak,
            peak_per_rank=tuple(peaks),
            scale=scale,
            fits=fits,
            limit=limit,
            placement=schedule.style,
            messages=sum(1 for a, b in zip(schedule.placement, schedule.placement[1:]) if a != b),
            layers_per_stage=model.layers_per_stage(schedule.stages, schedule.style),
            layer_assignment=assignment,
            memory_gb=memory_gb,
            objective=objective if family.uses_objective else None,
            recompute="all" if stages_recomputed else "none",
            peak_memory_bytes=peak_bytes,
            activation_bytes=activation_bytes,
            memory_counted=counted,
        )
        out.append(candidate if price is None else replace(candidate, priced=price(candidate, result)))
    return out
