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
   (:func:`~.search.advise`, steered to the memory of the member with the least state), and
   each member then prices its own collectives and per-rank memory (:mod:`.layout_rows`);
4. **pruned by a bound**: groups are searched in the order of a lower bound on their step (a
   rank's compute and TP collectives with no bubble and the whole replica batch as one
   microbatch, which pays TP's latencies once); once a searched layout is faster than a group's
   bound, that group cannot win and is named, not searched.

A searched group's schedules are searched in full: every family, chunk count and recomputation
choice at the microbatch count the model's microbatch size gives (:func:`microbatch_options`),
with no time budget that narrows it. Each candidate is priced for every member while its
simulation is at hand (:mod:`.layout_rows`), and each member keeps the best fitting candidate of
every family, naming the families with none: a member is left out only when no candidate fits it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

from ..errors import ConfigError, PipeschedError
from ..parallel_layout import ParallelLayout
from ..ranking import BASELINE
from ..registry import families as registered_families, get_family
from ..sharded_bytes import MIXED, Precision
from ..planning import MAX_PLANNING_SECONDS
from ..units import format_seconds
from .candidates import batch_plan, divisors, microbatch_options
from .estimate import GB, TransformerCosts
from .fabric import Fabric
from .layout import LayoutAdvice, LayoutCandidate
from .layout_costs import LayoutCosts
from .layout_rows import how_searched, member_rows, pricer
from .search import DEFAULT_MAX_CHUNKS, NoCandidateFitsError, advise, search_seconds


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
    ep: int = 1  # expert parallelism, given (advise/layout_costs.py prices it)


def layouts_of(problem: LayoutProblem, model: TransformerCosts) -> tuple[list[ParallelLayout], list[str]]:
    """Every layout of the GPUs with the fixed sizes, and the refused ones with why (step 1)."""
    fixed = dict(problem.fixed)
    for name, size in fixed.items():
        if problem.gpus % size:
            raise ConfigError(f"{flag_of(name)} {size} does not divide --gpus {problem.gpus}")
    product = math.prod(fixed.values())
    given = " x ".join(f"{flag_of(name)} {size}" for name, size in fixed.items())
    every = len(fixed) == len(DIMENSIONS)  # then the product must be the GPUs, else divide them
    if problem.gpus % product or (every and product != problem.gpus):
        raise ConfigError(f"{given} take {product} GPUs, which {'is not' if every else 'does not divide'} "
                          f"--gpus {problem.gpus}: fix sizes whose product {'is' if every else 'divides'} it, "
                          "or fewer dimensions")
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
    for what, count in (("attention heads", spec.head_count), ("hidden size", spec.hidden)):
        if count % layout.tp:
            return f"tp {layout.tp} does not divide the model's {count} {what}"
    if layout.pp > spec.layers:
        return f"{layout.pp} pipeline ranks for {spec.layers} layers"
    replica = problem.global_batch // layout.dp if problem.global_batch % layout.dp == 0 else None
    if layout.dp % problem.ep:
        return f"--ep {problem.ep} does not divide its {layout.dp} data-parallel ranks"
    if replica is None or replica % spec.microbatch_size:
        return (f"the global batch {problem.global_batch} does not split into {layout.dp} replicas of whole "
                f"microbatches of {spec.microbatch_size}")
    return None


def _name(layout: ParallelLayout) -> str:
    return f"pp {layout.pp} x dp {layout.dp_replicate} x dp_shard {layout.dp_shard} x tp {layout.tp}"


DIMENSIONS = ("pp", "dp_replicate", "dp_shard", "tp")


def _flags(layout: ParallelLayout) -> str:
    """The flags that fix every dimension of ``layout``."""
    return " ".join(f"{flag_of(d)} {getattr(layout, d)}" for d in DIMENSIONS)


def flag_of(dimension: str) -> str:
    """The command-line flag that fixes ``dimension`` (train's and advise's names)."""
    return {"pp": "--ranks", "dp_replicate": "--dp", "dp_shard": "--dp-shard", "tp": "--tp"}[dimension]


def costs_for(problem: LayoutProblem, model: TransformerCosts, layout: ParallelLayout) -> LayoutCosts:
    return LayoutCosts.for_layout(model, layout, problem.fabric, problem.precision, problem.sequence_parallel,
                                  ep=problem.ep)


def state_bytes(costs: LayoutCosts) -> float:
    """The fullest rank's bytes besides activations, one stage per rank."""
    return max(costs.state_bytes(costs.ranks, "loop"))


def lower_bound(costs: LayoutCosts, replica_batch: int) -> float:
    """No schedule of this pipeline is faster (see the module doc, step 4), ms."""
    whole = replica_batch / costs.spec.microbatch_size  # the replica's batch as one microbatch
    c = costs.costs(costs.ranks, "loop", whole)
    return c.F + c.B + c.W


def advise_whole_layouts(gpus: int, model: TransformerCosts, global_batch: int, fabric: Fabric,
                         fixed: Optional[dict] = None, precision: Precision = MIXED,
                         sequence_parallel: bool = True, replica_latency: float = 0.05, ep: int = 1,
                         **advise_options) -> LayoutAdvice:
    """Rank whole layouts with their schedules by predicted step time; see the module doc.
    ``fixed``: sizes of the dimensions the caller chose (``{"tp": 8}``). The microbatches are the
    model's microbatch size unless ``max_microbatches`` opens the count (:func:`microbatch_options`)."""
    problem = LayoutProblem(gpus, global_batch, fabric, tuple(sorted((fixed or {}).items())), precision,
                            sequence_parallel, replica_latency, ep)
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
    ranked: list[LayoutCandidate] = []
    searched: list[str] = []
    priced = 0
    for key in sorted(groups, key=lambda k: bounds[k]):
        best = min((c.step_time for c in ranked), default=None)
        if best is not None and bounds[key] >= best:
            omitted.extend(f"{_name(lay)}: at least {bounds[key]:.4g} ms per step from its compute alone, "
                           f"slower than {best:.4g} ms" for lay, _ in groups[key])
            continue
        members = sorted(groups[key], key=lambda m: state_bytes(m[1]))
        rows, lines, left_out, count = _search_group(problem, key, members, model.spec.microbatch_size, advise_options)
        priced += count
        ranked.extend(rows)
        searched.extend(lines)
        omitted.extend(left_out)
    if not ranked:
        raise ConfigError(f"no layout of {gpus} GPUs fits: " + "; ".join(omitted[:3]))
    ranked.sort(key=lambda c: (c.step_time, c.candidate.peak_memory_reference, c.dp * c.dp_shard, c.tp))
    return LayoutAdvice(gpus, global_batch, tuple(ranked), (), tuple(omitted), tuple(searched), priced)


def _search_group(problem: LayoutProblem, key: tuple[int, int, int], members: list[tuple[ParallelLayout, LayoutCosts]],
                  microbatch_size: int, advise_options: dict) -> tuple[list[LayoutCandidate], list[str], list[str], int]:
    """One group's schedules searched in full and priced for each member: its rows, how each
    member was searched, the members left out with why, and the candidates simulated."""
    options = microbatch_options(problem.global_batch // key[2], microbatch_size, advise_options)
    if key[0] == 1:  # one rank: every schedule is gradient accumulation
        options["families"] = [get_family(BASELINE)]
    chosen = [f for f in options.get("families") or registered_families() if f.parameter_copies == 1]
    families = [f.name for f in chosen]
    plan = batch_plan(key[0], options.get("microbatches"), options["global_batch"], options.get("microbatch_size"),
                      options.get("min_microbatch_size", 1), options.get("max_microbatches"))
    seconds = search_seconds(key[0], plan, chosen, options.get("max_chunks", DEFAULT_MAX_CHUNKS))
    if seconds > MAX_PLANNING_SECONDS and len(problem.fixed) < len(DIMENSIONS):
        return [], [], [f"{_name(lay)}: not searched: searching its schedules in full takes about "
                         f"{format_seconds(seconds)} of CPU (`{_flags(lay)}` searches this layout alone)"
                         for lay, _ in members], 0
    try:
        advice = advise(key[0], cost_model=members[0][1], refuse_slow=False,
                        price=pricer(members, problem.fabric, problem.replica_latency), **options)
        candidates, skipped = advice.candidates, advice.skipped
    except NoCandidateFitsError as err:  # held to the leanest member's state: the members' own peaks decide
        candidates, skipped = err.candidates, err.skipped
    except PipeschedError as err:
        return [], [], [f"{_name(lay)}: {err}" for lay, _ in members], 0
    counts = sorted({c.microbatches for c in candidates})
    how = f"{', '.join(map(str, counts))} microbatches"
    rows, lines, left_out = [], [], []
    for index, (layout, _) in enumerate(members):
        mine, why = member_rows(index, candidates, families, skipped)
        if mine:
            line = how_searched(how, why)
            lines.append(f"{_name(layout)}: {line}")
            rows.extend(replace(r, searched=line) for r in mine)
        else:
            left_out.append(f"{_name(layout)}: no candidate fits its memory ({'; '.join(why)})")
    return rows, lines, left_out, len(candidates)


def evaluate_setting(gpus: int, model: TransformerCosts, global_batch: int, fabric: Fabric, layout: ParallelLayout,
                     schedule: str, chunks: int, microbatches: int, recompute: bool, precision: Precision = MIXED,
                     sequence_parallel: bool = True, ep: int = 1) -> tuple[LayoutCandidate, bool]:
    """One given layout and setting (a published run's), priced as the search prices its own,
    and whether it fits the memory model (a setting that does not fit is still priced)."""
    problem = LayoutProblem(gpus, global_batch, fabric, (), precision, sequence_parallel, ep=ep)
    layout.check(gpus, heads=model.spec.head_count, hidden=model.spec.hidden)
    replica = global_batch // layout.dp
    if global_batch % layout.dp or replica % microbatches:
        raise ConfigError(f"the global batch {global_batch} does not split into {layout.dp} replicas of "
                          f"{microbatches} microbatches")
    sized = replace(model, spec=replace(model.spec, microbatch_size=replica // microbatches))  # the costs' reference
    costs = costs_for(problem, sized, layout)
    try:
        built = advise(layout.pp, cost_model=costs, global_batch=replica, microbatches=microbatches,
                       families=[get_family(schedule)], max_chunks=chunks, refuse_slow=False,
                       price=pricer([(layout, costs)], fabric, problem.replica_latency)).candidates
    except NoCandidateFitsError as err:
        built = err.candidates
    wanted = "all" if recompute else "none"
    match = [c for c in built if c.chunks == chunks and c.recompute == wanted]
    if not match:
        raise ConfigError(f"{schedule} with {chunks} chunks and {microbatches} microbatches was not built for {layout}")
    priced = match[0].priced[0]
    return priced, priced.candidate.fits
