"""Handcrafted Zero Bubble schedules, ZB-H1 and ZB-H2 (Qi et al., ICLR 2024).

The backward is split: ``I`` computes the input gradient that the previous stage waits for,
``W`` the weight gradient that nobody waits for. Sending ``I`` upstream early and using ``W`` to
fill idle time removes most of the bubble.

- **ZB-H1**, same memory as 1F1B: stage ``s`` runs ``p-s`` warm-up forwards, then per microbatch
  ``I``, the ``W`` of ``s`` microbatches earlier, and the next ``F``; the deferred ``W``s drain at
  the end. Bubble ``(p-1)(F+B-W)``: a third of 1F1B's at equal costs.
- **ZB-H2**, about twice 1F1B's memory: ``2(p-s)-1`` warm-up forwards, so the first backward
  reaches each stage exactly when its warm-up ends, then ``W``s fill every gap. The span per
  rank is ``3m`` at equal costs: zero bubble once iterations overlap.
"""

from __future__ import annotations

from typing import Optional

from ..actions import Action, F, I, W
from ..costs import UNIT, Costs
from ..placement import loop_placement
from ..schedule import Schedule
from .wfill import fill_weight_passes


def h1_stage_order(stage: int, ranks: int, microbatches: int) -> list[Action]:
    """ZB-H1 program of one stage."""
    m = microbatches
    order = [F(stage, k) for k in range(min(ranks - stage, m))]
    next_forward = len(order)
    next_weight = 0
    for k in range(m):
        order.append(I(stage, k))
        if k >= stage:
            order.append(W(stage, next_weight))
            next_weight += 1
        if next_forward < m:
            order.append(F(stage, next_forward))
            next_forward += 1
    order.extend(W(stage, k) for k in range(next_weight, m))
    return order


def build_h1(ranks: int, microbatches: int) -> Schedule:
    """ZB-H1: 1F1B's memory, a third of its bubble."""
    orders = tuple(tuple(h1_stage_order(s, ranks, microbatches)) for s in range(ranks))
    return Schedule(ranks, microbatches, loop_placement(ranks), orders, name="zb-h1")


def h2_forward_backward_order(stage: int, ranks: int, microbatches: int) -> list[Action]:
    """ZB-H2's forwards and input-gradient backwards of one stage (the Ws are filled in later)."""
    m = microbatches
    warmup = min(2 * (ranks - stage) - 1, m)
    order = [F(stage, k) for k in range(warmup)]
    next_forward = warmup
    for k in range(m):
        order.append(I(stage, k))
        if next_forward < m:
            order.append(F(stage, next_forward))
            next_forward += 1
    return order


def build_h2(
    ranks: int,
    microbatches: int,
    costs: Optional[Costs] = None,
    memory_limit: Optional[float] = None,
) -> Schedule:
    """ZB-H2: deep warm-up, every W used as filler; span ``3m`` at equal costs."""
    skeleton = [h2_forward_backward_order(s, ranks, microbatches) for s in range(ranks)]
    limit = memory_limit if memory_limit is not None else 2 * ranks
    return fill_weight_passes(
        skeleton, loop_placement(ranks), microbatches, costs or UNIT, limit, name="zb-h2"
    )
