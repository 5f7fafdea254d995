"""Choosing a whole layout: pp x dp_replicate x dp_shard x tp, then the schedule, chunks, microbatches.

Every layout of ``gpus`` (each dimension dividing it, any of them fixed by the caller) is either
searched or named with the reason it was left out:

1. **refused by the model**: ``tp`` must divide the heads and hidden size and stay inside a node
   (TP's all-reduces are on every layer's critical path: across nodes they cost more than they
   split); ``pp`` at most the layers; the global batch must split into the replicas' microbatches;
2. **pruned by memory**: the fullest rank's weights, gradients, optimizer state, gathered window
   and unsharded gradients alone (no activations yet) exceed the GPU's memory;
3. **pruned by symmetry**: layouts with the same ``pp``, ``tp`` and ``dp = dp_replicate x
   dp_shard`` run the same pipeline on the same microbatches: their schedules are searched once
   (:func:`~.search.advise`, held to the memory of the member with the least state), and each
   member then re-checks its own memory and prices its own collectives (:mod:`.sharded_step`);
4. **pruned by a bound**: groups are searched in the order of a lower bound on their step (a
   rank's compute and TP collectives with no bubble and the whole replica batch as one
   microbatch, which pays TP's latencies once); once a searched layout is faster than a group's
   bound, that group cannot win and is named, not searched.

Each searched group's schedule search gets an equal share of :data:`SEARCH_SECONDS` of planning
time (:func:`~.search.affordable_search` narrows it and says how).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from ..errors import ConfigError, PipeschedError
from ..parallel_layout import ParallelLayout
from ..ranking import BASELINE
from ..registry import build_schedule, get_family
from ..sharded_bytes import MIXED, Precision
from ..simulate import simulate
from .candidates import divisors
from .estimate import GB, TransformerCosts
from .fabric import Fabric
from .held_gradients import gradient_intervals, peak_with_gradients
from .layout import LayoutAdvice, LayoutCandidate
from .layout_costs import LayoutCosts
from .search import Advice, Candidate, advise, objective_option
from .sharded_step import layout_step

SEARCH_SECONDS = 12.0  # planning CPU seconds shared by the groups searched
KEEP = 3  # fastest fitting candidates of each group re-simulated per member (and its 1F1B)


@dataclass(frozen=True)
class LayoutProblem:
    """What the search is given besides the model: GPUs, batch, network, fixed dimensions."""

    gpus: int
    global_batch: int
    fabric: Fabric
    fixed: tuple[tuple[str, int], ...] = ()  # (dimension, size)
    precision: Precision = MIXED
    sequence_parallel: bool = True
    replica_latency: float = 0.05  # ms per all-reduce bucket between replicas


def layouts_of(problem: LayoutProblem, model: TransformerCosts) -> tuple[list[ParallelLayout], list[str]]:
    """Every layout of the GPUs with the fixed sizes, and the refused ones with why (step 1)."""
    fixed = dict(problem.fixed)
    for name, size in fixed.items():
        if problem.gpus % size:
            raise ConfigError(f"{flag_of(name)} {size} does not divide --gpus {problem.gpus}")
    out, refused, wide = [], [], 0
    for tp in divisors(problem.gpus):
        for pp in divisors(problem.gpus // tp):
            for shard in divisors(problem.gpus // (tp * pp)):
                layout = ParallelLayout(pp, problem.gpus // (tp * pp * shard), shard, tp)
                if any(getattr(layout, k) != v for k, v in fixed.items()):
                    continue
                why = _refusal(layout, model, problem)
                if why is None:
                    out.append(layout)
                elif why:
                    refused.append(f"{_name(layout)}: {why}")
                else:
                    wide += 1
    if wide:
        refused.append(f"{wide} layouts with tp above the {problem.fabric.gpus_per_node} GPUs of a node (every "
                       "layer's all-reduces would cross nodes; --tp fixes one)")
    if not out:
        raise ConfigError(f"no layout of {problem.gpus} GPUs can run this model: " + "; ".join(refused[:3]))
    return out, refused


def _refusal(layout: ParallelLayout, model: TransformerCosts, problem: LayoutProblem) -> Optional[str]:
    spec = model.spec
    fixed = dict(problem.fixed)
    if layout.tp > problem.fabric.gpus_per_node and "tp" not in fixed:
        return ""  # never worth naming one by one: summarised by the caller
    if spec.head_count % layout.tp or spec.hidden % layout.tp:
        return f"tp {layout.tp} does not divide the {spec.head_count} heads and hidden size {spec.hidden}"
    if layout.pp > spec.layers:
        return f"{layout.pp} pipeline ranks for {spec.layers} layers"
    replica = problem.global_batch // layout.dp if problem.global_batch % layout.dp == 0 else None
    if replica is None or replica % spec.microbatch_size:
        return (f"the global batch {problem.global_batch} does not split into {layout.dp} replicas of whole "
                f"microbatches of {spec.microbatch_size}")
    return None


def _name(layout: ParallelLayout) -> str:
    return f"pp {layout.pp} x dp {layout.dp_replicate} x dp_shard {layout.dp_shard} x tp {layout.tp}"


def flag_of(dimension: str) -> str:
    """The command-line flag that fixes ``dimension`` (train's and advise's names)."""
    return {"pp": "--ranks", "dp_replicate": "--dp", "dp_shard": "--dp-shard", "tp": "--tp"}[dimension]


def costs_for(problem: LayoutProblem, model: TransformerCosts, layout: ParallelLayout) -> LayoutCosts:
    return LayoutCosts.for_layout(model, layout, problem.fabric, problem.precision, problem.sequence_parallel)


def state_bytes(costs: LayoutCosts) -> float:
    """The fullest rank's bytes besides activations, one stage per rank."""
    return max(costs.state_bytes(costs.ranks, "loop"))


def lower_bound(costs: LayoutCosts, replica_batch: int) -> float:
    """No schedule of this pipeline is faster (see the module doc, step 4), ms."""
    whole = replica_batch / costs.spec.microbatch_size  # the replica's batch as one microbatch
    c = costs.costs(costs.ranks, "loop", whole)
    return c.F + c.B + c.W


def advise_whole_layouts(gpus: int, model: TransformerCosts, global_batch: int, fabric: Fabric,
                         fixed: Optional[dict] = None, keep: int = KEEP, precision: Precision = MIXED,
                         sequence_parallel: bool = True, replica_latency: float = 0.05,
                         **advise_options) -> LayoutAdvice:
    """Rank whole layouts with their schedules by predicted step time; see the module doc.
    ``fixed``: sizes of the dimensions the caller chose (``{"tp": 8}``)."""
    problem = LayoutProblem(gpus, global_batch, fabric, tuple(sorted((fixed or {}).items())), precision,
                            sequence_parallel, replica_latency)
    layouts, omitted = layouts_of(problem, model)
    budget = model.budget_bytes()
    groups: dict[tuple[int, int, int], list[tuple[ParallelLayout, LayoutCosts]]] = {}
    for layout in layouts:
        costs = costs_for(problem, model, layout)
        need = state_bytes(costs)
        if budget is not None and need > budget:
            omitted.append(f"{_name(layout)}: weights, gradients and optimizer state alone need {need / GB:.4g} GB "
                           f"of the {budget / GB:.4g} GB")
            continue
        groups.setdefault((layout.pp, layout.tp, layout.dp), []).append((layout, costs))
    bounds = {key: lower_bound(members[0][1], global_batch // key[2]) for key, members in groups.items()}
    order = sorted(groups, key=lambda k: bounds[k])
    share = SEARCH_SECONDS / max(1, len(order))
    ranked: list[LayoutCandidate] = []
    searched: list[str] = []
    for key in order:
        best = min((c.step_time for c in ranked), default=None)
        if best is not None and bounds[key] >= best:
            omitted.extend(f"{_name(lay)}: at least {bounds[key]:.4g} ms per step from its compute alone, "
                           f"slower than {best:.4g} ms" for lay, _ in groups[key])
            continue
        members = sorted(groups[key], key=lambda m: state_bytes(m[1]))
        options = dict(advise_options)
        if key[0] == 1:  # one rank: every schedule is gradient accumulation
            options["families"] = [get_family(BASELINE)]
        try:
            advice = advise(key[0], cost_model=members[0][1], global_batch=global_batch // key[2],
                            microbatch_size=model.spec.microbatch_size, budget=share, **options)
        except PipeschedError as err:
            omitted.extend(f"{_name(lay)}: {err}" for lay, _ in members)
            continue
        simulated: dict = {}
        for layout, costs in members:
            rows = _member_rows(problem, layout, costs, advice, keep, simulated)
            if rows:
                searched.append(f"{_name(layout)}: {advice.searched}")
                ranked.extend(rows)
            else:
                omitted.append(f"{_name(layout)}: no schedule fits its memory")
    if not ranked:
        raise ConfigError(f"no layout of {gpus} GPUs fits: " + "; ".join(omitted[:3]))
    ranked.sort(key=lambda c: (c.step_time, c.candidate.peak_memory_reference, c.dp * c.dp_shard, c.tp))
    return LayoutAdvice(gpus, global_batch, tuple(ranked), (), tuple(omitted), tuple(searched))


def _member_rows(problem: LayoutProblem, layout: ParallelLayout, costs: LayoutCosts, advice: Advice,
                 keep: int, simulated: dict) -> list[LayoutCandidate]:
    """The group's candidates that fit this member's memory, priced with its collectives
    (``simulated``: the group's simulations, shared by its members, by candidate)."""
    budget = costs.budget_bytes()
    extra = state_bytes(costs)
    fitting = [c for c in advice.fitting
               if budget is None or c.activation_bytes is None or c.activation_bytes + extra <= budget]
    shortlist = fitting[:keep] + [c for c in fitting if c.schedule == "1f1b" and c not in fitting[:keep]][:1]
    rows = []
    for c in shortlist:
        if id(c) not in simulated:
            simulated[id(c)] = _simulated(layout.pp, costs, c)
        rows.append(_priced(problem, layout, costs, c, *simulated[id(c)]))
    return rows


def _simulated(pp: int, costs: LayoutCosts, c: Candidate) -> tuple[LayoutCosts, object]:
    """The candidate's schedule simulated with its activations in bytes (the same for every member
    of its group: they differ in state and collectives, not in compute or activations)."""
    schedule = build_schedule(c.schedule, pp, c.microbatches, c.chunks, c.costs, c.memory_limit,
                              **objective_option(get_family(c.schedule), c.objective or "makespan"))
    sized = costs.with_layer_assignment(c.layer_assignment) if c.layer_assignment else costs
    sizes = sized.stage_sizes(schedule.stages, schedule.style, c.scale)
    if c.recompute != "none":
        sizes = sizes.with_recompute(range(schedule.stages))
    return sized, simulate(schedule, c.costs, sizes)


def _priced(problem: LayoutProblem, layout: ParallelLayout, costs: LayoutCosts, c: Candidate, sized: LayoutCosts,
            result) -> LayoutCandidate:
    """One member's row: the simulated pipeline with its collectives and its own bytes."""
    schedule = result.schedule
    member = replace(costs, layer_assignment=sized.layer_assignment)
    step = layout_step(result.timeline, member.gathered_bytes_per_stage(schedule.stages, schedule.style),
                       member.reduced_bytes_per_stage(schedule.stages, schedule.style), layout, problem.fabric,
                       c.microbatches, problem.replica_latency, units=max(member.layers_per_stage(schedule.stages, schedule.style)))
    peaks = _rank_peaks(layout, member, result)
    held = [{**b.to_json(), "activations": a, "peak": p}
            for b, a, p in zip(member.ranks_bytes(schedule.stages, schedule.style), result.peak_memory_bytes, peaks)]
    peak = max(peaks)
    own = replace(c, peak_memory_bytes=peak, memory_gb=peak / GB)
    return LayoutCandidate(layout.pp, layout.dp_replicate, own, step.step_time, step.exposed_reduce, step.reduce_per_rank,
                           tp=layout.tp, dp_shard=layout.dp_shard, exposed_gather=step.exposed_gather,
                           gather_per_rank=step.gather_per_rank, bytes_per_rank=tuple(held))


def evaluate_setting(gpus: int, model: TransformerCosts, global_batch: int, fabric: Fabric, layout: ParallelLayout,
                     schedule: str, chunks: int, microbatches: int, recompute: bool, precision: Precision = MIXED,
                     sequence_parallel: bool = True) -> tuple[LayoutCandidate, bool]:
    """One given layout and setting (a published run's), priced as the search prices its own,
    and whether it fits the memory model (a setting that does not fit is still priced)."""
    problem = LayoutProblem(gpus, global_batch, fabric, (), precision, sequence_parallel)
    layout.check(gpus, heads=model.spec.head_count, hidden=model.spec.hidden)
    replica = global_batch // layout.dp
    if global_batch % layout.dp or replica % microbatches:
        raise ConfigError(f"the global batch {global_batch} does not split into {layout.dp} replicas of "
                          f"{microbatches} microbatches")
    sized = replace(model, spec=replace(model.spec, microbatch_size=replica // microbatches))  # the costs' reference
    costs = costs_for(problem, sized, layout)
    advice = advise(layout.pp, cost_model=costs, global_batch=replica, microbatches=microbatches,
                    families=[get_family(schedule)], max_chunks=chunks)
    wanted = "all" if recompute else "none"
    match = [c for c in advice.candidates if c.chunks == chunks and c.recompute == wanted]
    if not match:
        raise ConfigError(f"{schedule} with {chunks} chunks and {microbatches} microbatches was not built for {layout}")
    priced = _priced(problem, layout, costs, match[0], *_simulated(layout.pp, costs, match[0]))
    budget = costs.budget_bytes()
    return priced, budget is None or priced.candidate.peak_memory_bytes <= budget


def _rank_peaks(layout: ParallelLayout, member: LayoutCosts, result) -> list[float]:
    """Each rank's peak bytes: its state plus its activations; with FSDP under pipelining the
    unsharded gradients are summed on the timeline (:mod:`.held_gradients`), not at the peak."""
    schedule = result.schedule
    state = member.state_bytes(schedule.stages, schedule.style)
    if layout.dp_shard == 1 or layout.pp == 1:
        return [a + s for a, s in zip(result.peak_memory_bytes, state)]
    grads = member.reduced_bytes_per_stage(schedule.stages, schedule.style)
    peaks = []
    for rank, constant in enumerate(state):
        held = gradient_intervals(result.timeline[rank], grads)
        rest = constant - sum(size for _, _, size in held)
        peaks.append(rest + peak_with_gradients(result.memory_curve(rank, in_bytes=True), held))
    return peaks
