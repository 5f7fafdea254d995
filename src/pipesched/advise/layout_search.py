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
4. **pruned by a proven bound**: groups are searched in the order of a lower bound on every
   fitting candidate's step (:mod:`.layout_bound`: a rank's unavoidable fill, its work, the
   microbatches its memory holds in flight and the collectives a step cannot hide); once a
   searched layout is faster than a group's bound, no candidate of that group can beat it, and
   its members are named with the bound: they cannot beat the pick, whatever their search would find.

A searched group's schedules are searched in full: every family, chunk count and recomputation
choice at the microbatch count the model's microbatch size gives (:func:`microbatch_options`),
however long that takes (``layouts_done`` hears of each group's verdict). Each candidate is priced for
every member while its simulation is at hand (:mod:`.layout_rows`), and each member keeps the
best fitting candidate of every family among those builds, naming the families with none: a
member is left out only when no candidate fits it. The builds are steered to the leanest
member's memory, so a member holding more state may find a family's best at its own limit
slower than that family steered to it (docs/layouts.md says by how much on the 1T layout). A
layout's verdict never depends on how far a search went.

With experts (``--experts``) and ``ep`` left open, every EP size that divides the routed experts
and the layout's data-parallel ranks (torchtitan's convention: EP borrows ranks of ``dp_shard x
dp``) is a layout of its own; groups then also share ``ep`` and its link (:meth:`~.fabric.Fabric.expert_link`:
the all-to-alls are on the compute lane the group's simulation prices).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Optional

from ..errors import ConfigError, PipeschedError
from ..parallel_layout import ParallelLayout
from ..ranking import BASELINE
from ..registry import families as registered_families, get_family
from ..sharded_bytes import MIXED, Precision
from .candidates import BatchPlan, batch_plan, chunk_options, divisors, microbatch_options
from .estimate import GB, TransformerCosts
from .fabric import Fabric
from .layout import LayoutAdvice, LayoutCandidate
from .layout_bound import group_bound
from .layout_costs import LayoutCosts
from .layout_rows import how_searched, member_rows, pricer
from .search import DEFAULT_MAX_CHUNKS, NoCandidateFitsError, advise


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
    ep: Optional[int] = 1  # expert parallelism, given (advise/layout_costs.py prices it); None: every size tried


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
    if problem.ep is not None and layout.dp % problem.ep:
        return f"--ep {problem.ep} does not divide its {layout.dp} data-parallel ranks"
    if replica is None or replica % spec.microbatch_size:
        return (f"the global batch {problem.global_batch} does not split into {layout.dp} replicas of whole "
                f"microbatches of {spec.microbatch_size}")
    return None


def _name(layout: ParallelLayout, ep: int = 1) -> str:
    return (f"pp {layout.pp} x dp {layout.dp_replicate} x dp_shard {layout.dp_shard} x tp {layout.tp}"
            + (f" x ep {ep}" if ep > 1 else ""))


DIMENSIONS = ("pp", "dp_replicate", "dp_shard", "tp")


def flag_of(dimension: str) -> str:
    """The command-line flag that fixes ``dimension`` (train's and advise's names)."""
    return {"pp": "--ranks", "dp_replicate": "--dp", "dp_shard": "--dp-shard", "tp": "--tp"}[dimension]


def costs_for(problem: LayoutProblem, model: TransformerCosts, layout: ParallelLayout, ep: int = 1) -> LayoutCosts:
    return LayoutCosts.for_layout(model, layout, problem.fabric, problem.precision, problem.sequence_parallel, ep=ep)


def ep_options(problem: LayoutProblem, model: TransformerCosts, layout: ParallelLayout) -> list[int]:
    """The EP sizes a layout is searched at: the one given, else 1 for a dense model, else every
    size dividing the routed experts and the layout's data-parallel ranks (the module doc)."""
    experts = model.spec.experts
    if problem.ep is not None:
        return [problem.ep]
    return [1] if experts is None else [e for e in divisors(layout.dp) if experts.routed % e == 0]


def state_bytes(costs: LayoutCosts) -> float:
    """The fullest rank's bytes besides activations, one stage per rank."""
    return max(costs.state_bytes(costs.ranks, "loop"))


Member = tuple[ParallelLayout, LayoutCosts]
Progress = Callable[[int, int], None]  # (layouts given a verdict, layouts in all)


def advise_whole_layouts(gpus: int, model: TransformerCosts, global_batch: int, fabric: Fabric,
                         fixed: Optional[dict] = None, precision: Precision = MIXED,
                         sequence_parallel: bool = True, replica_latency: float = 0.05, ep: Optional[int] = None,
                         layouts_done: Optional[Progress] = None, **advise_options) -> LayoutAdvice:
    """Rank whole layouts with their schedules by predicted step time; see the module doc.
    ``fixed``: sizes of the dimensions the caller chose (``{"tp": 8}``); ``ep``: expert
    parallelism, given, or None to try every size that divides. The microbatches are the
    model's microbatch size unless ``max_microbatches`` opens the count (:func:`microbatch_options`).
    ``layouts_done(done, total)`` hears of each group's verdict (a progress line)."""
    problem = LayoutProblem(gpus, global_batch, fabric, tuple(sorted((fixed or {}).items())), precision,
                            sequence_parallel, replica_latency, ep)
    layouts, omitted = layouts_of(problem, model)
    budget = model.budget_bytes()
    groups: dict[tuple, list[Member]] = {}
    for layout in layouts:
        for size in ep_options(problem, model, layout):
            costs = costs_for(problem, model, layout, size)
            need = state_bytes(costs)
            if budget is not None and need > budget:
                omitted.append(f"{_name(layout, size)}: weights, gradients and optimizer state alone need "
                               f"{need / GB:.4g} GB of the {budget / GB:.4g} GB")
                continue
            groups.setdefault((layout.pp, layout.tp, layout.dp, size, costs.ep_link), []).append((layout, costs))
    mbs = model.spec.microbatch_size
    plans = {key: _plan(problem, key, mbs, advise_options) for key in groups}
    bounds = {key: _bound(sorted(members, key=lambda m: state_bytes(m[1])), problem, *plans[key])
              for key, members in groups.items()}
    ranked: list[LayoutCandidate] = []
    searched: list[str] = []
    priced, done, total = 0, 0, sum(map(len, groups.values()))
    for key in sorted(groups, key=lambda k: bounds[k]):
        best = min((c.step_time for c in ranked), default=None)
        if best is not None and bounds[key] >= best:
            omitted.extend(f"{_name(lay, key[3])}: cannot beat the pick: every fitting candidate takes at least "
                           f"{bounds[key]:.4g} ms per step (a rank's fill, its work, the microbatches its memory "
                           f"holds and the collectives), and a searched layout takes {best:.4g} ms" for lay, _ in groups[key])
        else:
            members = sorted(groups[key], key=lambda m: state_bytes(m[1]))
            rows, lines, left_out, count = _search_group(problem, key, members, *plans[key])
            priced += count
            ranked.extend(rows)
            searched.extend(lines)
            omitted.extend(left_out)
        done += len(groups[key])
        if layouts_done is not None:
            layouts_done(done, total)
    if not ranked:
        raise ConfigError(f"no layout of {gpus} GPUs fits: " + "; ".join(omitted[:3]))
    ranked.sort(key=lambda c: (c.step_time, c.candidate.peak_memory_reference, c.dp * c.dp_shard, c.tp, c.ep))
    return LayoutAdvice(gpus, global_batch, tuple(ranked), (), tuple(omitted), tuple(searched), priced)


def _plan(problem: LayoutProblem, key: tuple, microbatch_size: int, advise_options: dict) -> tuple[dict, BatchPlan]:
    """A group's search options (:func:`~.search.advise`'s) and the microbatch counts they give."""
    pp, dp = key[0], key[2]
    options = microbatch_options(problem.global_batch // dp, microbatch_size, advise_options)
    if pp == 1:  # one rank: every schedule is gradient accumulation
        options["families"] = [get_family(BASELINE)]
    plan = batch_plan(pp, options.get("microbatches"), options["global_batch"], options.get("microbatch_size"),
                      options.get("min_microbatch_size", 1), options.get("max_microbatches"))
    return options, plan


def _bound(members: list[Member], problem: LayoutProblem, options: dict, plan: BatchPlan) -> float:
    """The group's proven bound on its members' fitting rows (:mod:`.layout_bound`) over what its
    search tries; ``members`` leanest first (the one its search is steered by)."""
    families = options.get("families") or registered_families()
    if any(f.parameter_copies != 1 for f in options.get("families") or ()):
        return 0.0  # the bound's fill argument is one pipeline's: DualPipe's two copies, asked for, are never pruned
    top = max(max(c for f in families for c in chunk_options(f, options.get("max_chunks", DEFAULT_MAX_CHUNKS))), 2)
    return group_bound(members, plan.options, plan.reference, top, problem.fabric, problem.replica_latency)


def _search_group(problem: LayoutProblem, key: tuple, members: list[Member], options: dict,
                  plan: BatchPlan) -> tuple[list[LayoutCandidate], list[str], list[str], int]:
    """One group's schedules searched in full and priced for each member: its rows, how each
    member was searched, the members left out with why, and the candidates simulated."""
    families = [f.name for f in options.get("families") or registered_families() if f.parameter_copies == 1]
    try:
        advice = advise(key[0], cost_model=members[0][1], refuse_slow=False,
                        price=pricer(members, problem.fabric, problem.replica_latency), **options)
        candidates, skipped = advice.candidates, advice.skipped
    except NoCandidateFitsError as err:  # held to the leanest member's state: the members' own peaks decide
        candidates, skipped = err.candidates, err.skipped
    except PipeschedError as err:
        return [], [], [f"{_name(lay, key[3])}: {err}" for lay, _ in members], 0
    how = f"{', '.join(map(str, plan.options))} microbatches"
    rows, lines, left_out = [], [], []
    for index, (layout, _) in enumerate(members):
        mine, why = member_rows(index, candidates, families, skipped)
        if mine:
            line = how_searched(how, why)
            lines.append(f"{_name(layout, key[3])}: {line}")
            rows.extend(replace(r, searched=line) for r in mine)
        else:
            left_out.append(f"{_name(layout, key[3])}: no candidate fits its memory ({'; '.join(why)})")
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
    costs = costs_for(problem, sized, layout, ep)
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
