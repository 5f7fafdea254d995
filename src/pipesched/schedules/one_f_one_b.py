"""1F1B (PipeDream-Flush): after a short warm-up, one forward then one backward.

Stage ``s`` runs ``p-s-1`` warm-up forwards, then alternates one forward and one full backward,
then drains the remaining backwards. Same bubble as GPipe, ``(p-1)(F+B+W)``, but a stage holds at
most ``p-s`` microbatches' activations (``min(p, m)`` on the first stage). Any ``m`` works: with
fewer microbatches than stages the warm-up is simply shorter (torch refuses this case).
"""

from __future__ import annotations

from ..actions import Action, B, F
from ..placement import loop_placement
from ..schedule import Schedule


def stage_order(stage: int, ranks: int, microbatches: int) -> list[Action]:
    """1F1B program of one stage: warm-up forwards, steady 1F1B, cool-down backwards."""
    warmup = min(ranks - stage - 1, microbatches)
    order = [F(stage, k) for k in range(warmup)]
    next_forward = warmup
    for k in range(microbatches):
        if next_forward < microbatches:
            order.append(F(stage, next_forward))
            next_forward += 1
        order.append(B(stage, k))
    return order


def build(ranks: int, microbatches: int) -> Schedule:
    """1F1B with one stage per rank."""
    orders = tuple(tuple(stage_order(s, ranks, microbatches)) for s in range(ranks))
    return Schedule(ranks, microbatches, loop_placement(ranks), orders, name="1f1b")
