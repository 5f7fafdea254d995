"""A proven lower bound on every candidate of a layout group: what lets the layout search skip a
group without searching it, and say why (a verdict, not a guess).

A group (``pp``, ``tp``, ``dp``, and ``ep`` with its link) runs one pipeline of ``p = pp`` ranks.
Every candidate the search builds for it is a schedule of ``S`` stages placed in a loop (``S =
v p``) or a V (``S = 2p``), its layers split by the model for that placement and one of its layer
assignments, simulated with the durations :func:`pipesched.costs.durations_for` gives for the
model's costs at that split and the candidate's microbatch size. Under both placements stage
``s < p`` sits on rank ``s`` and every other stage of rank ``r`` is later in model order, so:

- **fill**: no operation of rank ``r`` starts before one microbatch's forwards of stages
  ``0 .. r-1`` and their ``r`` sends (``comm`` each: every one crosses ranks) have run, ``a_r``;
- **work**: a rank runs its operations one after another, ``m`` microbatches' forward and
  backward of each of its stages (a backward is the cheaper of the fused ``B`` and the split
  ``I + W``; recomputation only adds forwards). A DualPipe pair takes ``max(F, B) + overlap x
  min(F, B) >= B + overlap x F`` (:mod:`pipesched.execution`), so where EP's all-to-alls are
  hidden that way each forward counts ``overlap`` of itself, in the fill too;

so a candidate's makespan is at least ``max_r (a_r + work_r)``, and a row's step time, which
adds the data-parallel collectives that outlast it (:mod:`.sharded_step`), no less. The group's
bound is the least of that over every placement, chunk count up to the search's, layer
assignment and microbatch count the search tries (more layouts than any family builds: a
bound over more is still a bound). The drain is not counted: zero-bubble families fill it with
deferred weight gradients. tests/test_layout_bound.py checks the bound against the simulated
makespan of every candidate of many small groups.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from ..costs import durations_for
from ..errors import ConfigError
from ..ops import Op
from ..placement import loop_placement, v_placement
from .layout_costs import LayoutCosts


def group_bound(costs: LayoutCosts, microbatch_counts: Iterable[int], reference: int, max_chunks: int) -> float:
    """No candidate of this group's pipeline has a makespan below this, ms (see the module doc).
    ``microbatch_counts``: those the search tries; ``reference``: the count the costs'
    microbatch size gives (``m`` microbatches are ``reference / m`` times that size);
    ``max_chunks``: the most stages per rank any family is built with."""
    return min(candidate_bound(split, style, placement, m, reference / m)
               for m in microbatch_counts
               for split, style, placement in _layouts(costs, max_chunks))


def _layouts(costs: LayoutCosts, max_chunks: int) -> Iterator[tuple[LayoutCosts, str, tuple[int, ...]]]:
    """Every (layer split's model, placement) a candidate of the group can be simulated with."""
    p = costs.ranks
    shapes = [(v * p, "loop", loop_placement(p, v)) for v in range(1, max_chunks + 1)]
    shapes.append((2 * p, "v", v_placement(p)))
    for stages, style, placement in shapes:
        try:
            names = costs.layer_assignments(stages, style)
        except ConfigError:  # more stages than the model has layers: no family builds it
            continue
        for name in names:
            yield costs.with_layer_assignment(name), style, placement


def candidate_bound(costs: LayoutCosts, style: str, placement: tuple[int, ...], microbatches: int,
                    scale: float) -> float:
    """``max_r (a_r + work_r)`` for one split, ``style`` (``loop`` or ``v``) and its placement
    (the module doc), ms."""
    p, stages = costs.ranks, len(placement)
    c = costs.costs(stages, style, scale)
    table = durations_for(placement, p, c)
    forward = [c.overlap * table[(s, Op.F)] for s in range(stages)]
    backward = [min(table[(s, Op.B)], table[(s, Op.I)] + table[(s, Op.W)]) for s in range(stages)]
    work = [0.0] * p
    for s, rank in enumerate(placement):
        work[rank] += microbatches * (forward[s] + backward[s])
    return max(sum(forward[:r]) + r * c.comm + work[r] for r in range(p))
