"""DualPipe: DeepSeek's bidirectional pipeline, two model copies fed from opposite ends.

``p`` ranks (``p`` even) run two pipelines of ``p`` stages each. The forward-direction copy
puts its stage ``j`` on rank ``j``; the reverse copy puts its stage ``j`` on rank ``p-1-j``, so
rank ``r`` holds stage ``r`` of one copy and stage ``p-1-r`` of the other: twice the
parameters of a plain ``p``-rank pipeline. The first ``ceil(m/2)`` microbatches enter at rank 0,
the rest at rank ``p-1``.

In the IR this is ``2p`` stages in the V placement (stages ``0..p-1`` the forward copy, stage
``p+j`` the reverse copy's stage ``j``, on rank ``p-1-j``) with ``pipelines=2``: each run of
``p`` stages is its own pipeline with its own microbatches, which execution, validation,
simulation and the drawings read from the schedule (see :class:`~pipesched.schedule.Schedule`).

The order is DualPipe's: rank ``r`` runs DualPipeV's program for rank ``h = min(r, p-1-r)`` of
``p/2`` ranks on the microbatches of one direction, its chunk 0 being the copy whose inputs
enter on rank ``r``'s side and chunk 1 the other (DualPipeV is DualPipe folded in half, ranks
``r`` and ``p-1-r`` on one device). Peak activations: ``p + 1`` microbatches' for ``m >= 2p``.
"""

from __future__ import annotations

from ..actions import Action, Overlap, Slot
from ..errors import ConfigError
from ..placement import v_placement
from ..schedule import Schedule
from .dualpipev import rank_program as folded_program, trimmed

PIPELINES = 2


def build(ranks: int, microbatches: int) -> Schedule:
    """DualPipe on ``ranks`` ranks (even), half the microbatches from each end; costs do not
    change the order."""
    if ranks % 2:
        raise ConfigError(
            f"dualpipe needs an even number of ranks (rank r pairs with rank p-1-r), got ranks={ranks}"
        )
    if microbatches < PIPELINES:
        raise ConfigError(f"dualpipe needs microbatches >= 2 (one per direction), got {microbatches}")
    skeleton = Schedule(ranks, microbatches, v_placement(ranks), (), name="dualpipe", pipelines=PIPELINES)
    forward_count = len(skeleton.stage_microbatches(0))
    orders = tuple(
        tuple(trimmed(
            [_relabel(entry, rank, ranks, forward_count) for entry in folded_program(
                min(rank, ranks - 1 - rank), ranks // 2, forward_count)],
            lambda a: a.microbatch in skeleton.stage_microbatches(a.stage),
        ))
        for rank in range(ranks)
    )
    return Schedule(ranks, microbatches, skeleton.placement, orders, name="dualpipe", pipelines=PIPELINES)


def _relabel(entry: Slot, rank: int, ranks: int, forward_count: int) -> Slot:
    """A folded (DualPipeV) entry as this rank's: chunk 0 (folded stages below ``ranks/2``)
    is the copy entering on this rank's side, chunk 1 the other; the reverse copy's stage
    ``j`` is stage ``ranks + j`` and its microbatches follow the forward copy's."""
    near_is_forward = rank < ranks // 2

    def action(a: Action) -> Action:
        forward_copy = (a.stage < ranks // 2) == near_is_forward
        if forward_copy:
            return a
        return Action(ranks + a.stage, a.kind, forward_count + a.microbatch)

    if isinstance(entry, Overlap):
        return Overlap(action(entry.forward), action(entry.backward))
    return action(entry)
