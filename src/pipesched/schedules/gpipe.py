"""GPipe: every forward, then every backward.

The simplest pipeline: stage ``s`` runs ``F`` on all ``m`` microbatches, then the full backward
``B`` on all of them. Bubble ``(p-1)(F+B+W)``, like 1F1B, but every microbatch's activations
stay alive until its backward: peak memory ``m`` (in one microbatch's activations).
"""

from __future__ import annotations

from ..actions import B, F
from ..placement import loop_placement
from ..schedule import Schedule


def build(ranks: int, microbatches: int) -> Schedule:
    """All forwards, then all backwards, one stage per rank."""
    orders = []
    for stage in range(ranks):
        forwards = [F(stage, k) for k in range(microbatches)]
        backwards = [B(stage, k) for k in range(microbatches)]
        orders.append(tuple(forwards + backwards))
    return Schedule(ranks, microbatches, loop_placement(ranks), tuple(orders), name="gpipe")
