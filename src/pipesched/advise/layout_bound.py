"""A proven lower bound on every candidate of a layout group: what lets the layout search skip a
group without searching it, and say why (a verdict, not a guess).

A group (``pp``, ``tp``, ``dp``, and ``ep`` with its link) runs one pipeline of ``p = pp`` ranks.
Every candidate the search builds for it is a schedule of ``S`` stages placed in a loop (``S =
v p``) or a V (``S = 2p``), its layers split by the model for that placement and one of its layer
assignments, simulated with the durations :func:`pipesched.costs.durations_for` gives for the
model's costs at that split and the candidate's microbatch size. Under both placements stage
``s < p`` sits on rank ``s`` and every other stage of rank ``r`` is later in model order, and
every family the search builds runs one pipeline (``F(s)`` waits for ``F(s-1)``; DualPipe's two
copies are not searched), so, with times counted from rank 0's first forward:

- **fill**: no operation of rank ``r`` starts before one microbatch's forwards of stages
  ``0 .. r-1`` and their sends (``comm`` each that crosses ranks) have run, ``a_r``;
- **work**: a rank runs its operations one after another, ``m`` microbatches' forward and
  backward of each of its stages (a backward is the cheaper of the fused ``B`` and the split
  ``I + W``; recomputation only adds forwards). A DualPipe pair takes ``max(F, B) + overlap x
  min(F, B) >= B + overlap x F`` (:mod:`pipesched.execution`), so where EP's all-to-alls are
  hidden that way each forward counts ``overlap`` of itself, in the fill too;
- **warm-up held by memory**: until ``c_r``, the time a forward can first reach rank ``r``'s
  second stage (with one stage per rank, the first input gradient can come back to it), rank
  ``r`` can run nothing but forwards of its first stage, and each of those holds its ``keep``
  bytes (:class:`pipesched.memory.StageMemory`; a recomputed stage's, if smaller) until its
  backward, after ``c_r``. A rank runs its program in order, so a candidate that fits its
  member's activation budget (:meth:`.layout_costs.LayoutCosts.activation_budgets`) runs at most
  ``k_r = budget / keep`` of them (and at most ``m``) before ``c_r``: its last operation ends at
  ``max(a_r + work_r, c_r + work_r - k_r f_r)`` or later;
- **microbatches in flight**: a forward of stage ``r`` holds its bytes until its input
  gradient's pass ends, at least ``t_r`` later (the forwards from stage ``r`` to the last, the
  input gradients back to ``r`` and their sends). At most ``k_r`` such intervals overlap, so
  (intervals of at most ``k_r`` at a time split into ``k_r`` runs of disjoint ones) one run
  holds ``ceil(m / k_r)`` of them: rank ``r`` ends at ``a_r + ceil(m / k_r) t_r`` or later, and
  where not one forward fits (``k_r = 0``) no candidate of that variant fits;

so a candidate's makespan is at least ``max_r (a_r + work_r)`` and, if it fits a member's memory,
the largest over the ranks of their end with both memory terms, the lesser over a candidate's two
variants (nothing, or every stage, recomputed: ``k_r`` from either's ``keep``). A member's row adds its data-parallel collectives
(:mod:`.sharded_step`): rank 0's first stage is used at its first operation, so the step waits
for that stage's all-gather (every later time shifts by at least it), and a rank's last
operation is a ``B`` or ``W`` (every ``F`` and ``I`` of a stage is followed by its backward or
``W`` on the same rank), after which that stage's gradients are reduced: at least the cheapest
reduction of the rank's stages. Without a pipeline (``pp == 1``, FSDP resharding) the step adds
the first block's gather and the last block's reduction.

The group's bound is the least of that over every member, placement, chunk count up to the
search's, layer assignment and microbatch count the search tries (more layouts than any family
builds: a bound over more is still a bound); a searched layout's rows are fitting candidates,
so a group whose bound is at least the pick's step has no row that beats it. The drain is not
counted: zero-bubble families fill it with deferred weight gradients. tests/test_layout_bound.py
checks the makespan bound against every candidate of many small groups and the step bound
against every fitting row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional, Sequence

from ..costs import durations_for
from ..errors import ConfigError
from ..ops import Op
from ..parallel_layout import ParallelLayout
from ..placement import loop_placement, v_placement
from .fabric import Fabric
from .layout_costs import LayoutCosts
from .sharded_step import ShardedReduction, gather_times

Member = tuple[ParallelLayout, LayoutCosts]
MARGIN = 1e-6  # a fit is judged within a relative tolerance: count a fraction more microbatches as held


@dataclass(frozen=True)
class Pipeline:
    """One (split, placement, microbatch count)'s timing facts, per rank (ms; see the module doc)."""

    stages: int
    style: str
    placement: tuple[int, ...]
    microbatches: int
    scale: float
    fill: tuple[float, ...]  # a_r
    work: tuple[float, ...]  # work_r
    held_until: tuple[float, ...]  # c_r
    round_trip: tuple[float, ...]  # t_r: from a forward of stage r to the end of its input gradient's pass
    forwards: tuple[float, ...]  # what one forward of each stage counts in work (f_r: stage r's)

    @property
    def forward(self) -> tuple[float, ...]:
        return self.forwards[:len(self.fill)]

    def makespan_bound(self) -> float:
        return max(a + w for a, w in zip(self.fill, self.work))


def group_bound(members: Sequence[Member], microbatch_counts: Iterable[int], reference: int, max_chunks: int,
                fabric: Optional[Fabric] = None, replica_latency: float = 0.0) -> float:
    """No candidate of this group's pipeline has a makespan below this, ms; with ``fabric``, no
    fitting row of any member has a step below it (see the module doc). ``members``: the group's
    layouts with their costs (the first one's times serve all: members share them);
    ``microbatch_counts``: those the search tries; ``reference``: the count the costs'
    microbatch size gives (``m`` microbatches are ``reference / m`` times that size);
    ``max_chunks``: the most stages per rank any family is built with."""
    lead = members[0][1]
    bounds = []
    for m in microbatch_counts:
        for name, style, placement in _layouts(lead, max_chunks):
            pipe = pipeline(lead.with_layer_assignment(name), style, placement, m, reference / m)
            bounds.append(pipe.makespan_bound() if fabric is None else
                          min(step_bound(pipe, layout, costs.with_layer_assignment(name), fabric, replica_latency)
                              for layout, costs in members))
    return min(bounds)


def _layouts(costs: LayoutCosts, max_chunks: int) -> Iterator[tuple[str, str, tuple[int, ...]]]:
    """Every (layer assignment, placement style, placement) a candidate of the group can be simulated with."""
    p = costs.ranks
    shapes = [(v * p, "loop", loop_placement(p, v)) for v in range(1, max_chunks + 1)]
    shapes.append((2 * p, "v", v_placement(p)))
    for stages, style, placement in shapes:
        try:
            names = costs.layer_assignments(stages, style)
        except ConfigError:  # more stages than the model has layers: no family builds it
            continue
        for name in names:
            yield name, style, placement


def pipeline(costs: LayoutCosts, style: str, placement: tuple[int, ...], microbatches: int, scale: float) -> Pipeline:
    """The fill, work and warm-up limit of each rank for one split, ``style`` (``loop`` or ``v``)
    and its placement (the module doc)."""
    p, stages = costs.ranks, len(placement)
    c = costs.costs(stages, style, scale)
    table = durations_for(placement, p, c)
    forward = [c.overlap * table[(s, Op.F)] for s in range(stages)]
    backward = [min(table[(s, Op.B)], table[(s, Op.I)] + table[(s, Op.W)]) for s in range(stages)]
    gradient = [min(table[(s, Op.B)], table[(s, Op.I)]) for s in range(stages)]  # the input gradient's pass
    hop = [c.comm * (placement[s] != placement[s + 1]) for s in range(stages - 1)]
    arrive = [0.0]  # the earliest start of each stage's first forward
    for s in range(stages - 1):
        arrive.append(arrive[s] + forward[s] + hop[s])
    work = [0.0] * p
    for s, rank in enumerate(placement):
        work[rank] += microbatches * (forward[s] + backward[s])
    held = []
    for r in range(p):
        later = [s for s in range(r + 1, stages) if placement[s] == r]
        if later:
            held.append(arrive[later[0]])
        else:  # the first input gradient back from the last stage
            held.append(arrive[-1] + forward[-1] + sum(gradient[r + 1:]) + sum(hop[r:]))
    back = arrive[-1] + forward[-1] + sum(hop)  # the last forward's end, and every send back
    trip = [back - arrive[r] + sum(gradient[r:]) - sum(hop[:r]) for r in range(p)]
    return Pipeline(stages, style, placement, microbatches, scale, tuple(arrive[:p]), tuple(work), tuple(held),
                    tuple(trip), tuple(forward))


def step_bound(pipe: Pipeline, layout: ParallelLayout, costs: LayoutCosts, fabric: Fabric,
               replica_latency: float) -> float:
    """No fitting row of the member ``layout`` (``costs``: its own, at the split's layer
    assignment) for this pipeline has a step below this, ms (the module doc)."""
    stages, style = pipe.stages, pipe.style
    m = pipe.microbatches
    ends = [min(max(a + w + more, c + w + more - k * f, a + math.ceil(m / k) * t) if k else math.inf
                for more, k in options)
            for a, w, c, t, f, options in zip(pipe.fill, pipe.work, pipe.held_until, pipe.round_trip, pipe.forward,
                                              _choices(costs, pipe))]
    units = max(costs.layers_per_stage(stages, style))
    gather = gather_times(costs.gathered_bytes_per_stage(stages, style), layout, fabric, units)
    reduction = ShardedReduction(layout, fabric, replica_latency, units)
    reduced = costs.reduced_bytes_per_stage(stages, style)
    times = {b: reduction.time(b) for b in set(reduced)}  # stages of equal bytes: one price
    reduce = [times[b] for b in reduced]
    if layout.pp == 1 and layout.dp_shard > 1 and not costs.precision.zero1:  # FSDP resharding every block
        return max(ends) + (gather[0] + min(reduce)) / units
    last = [min(t for s, t in enumerate(reduce) if pipe.placement[s] == r) for r in range(len(ends))]
    return gather[0] + max(e + t for e, t in zip(ends, last))


def _choices(costs: LayoutCosts, pipe: Pipeline) -> list[list[tuple[float, float]]]:
    """Per rank, for stored and for recomputed activations (a candidate's two variants: no stage
    or every stage recomputed), the work recomputation adds (a recomputed stage's backward re-runs
    its forward) and ``k_r``, the most forwards of the rank's first stage a fitting candidate
    holds at once."""
    m = pipe.microbatches
    budgets = costs.activation_budgets(pipe.stages, pipe.style)
    sizes = costs.stage_sizes(pipe.stages, pipe.style, pipe.scale)
    if budgets is None or sizes is None:  # nothing to fit: nothing recomputed either
        return [[(0.0, m)] for _ in pipe.fill]
    stored, recomputed = sizes.effective(), sizes.with_recompute(range(pipe.stages)).effective()
    out = []
    for r, budget in enumerate(budgets):
        rerun = m * sum(f for s, f in enumerate(pipe.forwards) if pipe.placement[s] == r)
        out.append([(0.0, _held(stored[r].keep, budget, m)), (rerun, _held(recomputed[r].keep, budget, m))])
    return out


def _held(keep: float, budget: float, microbatches: int) -> float:
    """How many forwards keeping ``keep`` bytes each fit in ``budget`` bytes (at most ``microbatches``)."""
    if keep <= 0:
        return microbatches
    return min(microbatches, math.floor(max(budget, 0.0) * (1 + MARGIN) / keep))
