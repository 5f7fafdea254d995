"""Which tensors cross which link, and in what order, derived once from the global schedule.

Every rank derives the same plan from the same Schedule, so sender and receiver agree on every
message without talking. A message is one stage's activation (after ``F``) or input gradient
(after ``I``/``B``) for one microbatch. On each directed link the messages are ordered as the
sender produces them; the receiver posts its receives in that same order, ahead of need.
Because the sender produced every earlier message on a link before a later one, waiting for the
message an action needs never waits on a message that cannot come: a schedule that the
execution model runs without deadlock cannot hang at run time. Same-rank neighbours (the turn of
a V) hand tensors over in memory; no message.

This module is pure Python (no torch): the plan can be inspected and tested anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Optional

from ..actions import Action
from ..execution import consumer_stage, crosses_ranks, dependency
from ..schedule import Schedule

ACT, GRAD = "act", "grad"


class Message(NamedTuple):
    """``kind`` ACT: output of ``stage``'s F; GRAD: input gradient of ``stage``'s I/B."""

    kind: str
    stage: int
    microbatch: int
    src: int
    dst: int
    tag: int


@dataclass
class RankPlan:
    """What one rank does: its actions, and for each, the message it sends and the one it needs."""

    rank: int
    actions: list[Action]
    sends: list[Optional[Message]]  # per action
    needs: list[Optional[Message]]  # per action
    incoming: dict[int, list[Message]] = field(default_factory=dict)  # src -> link order
    outgoing_peers: list[int] = field(default_factory=list)

    def link_position(self) -> dict[Message, int]:
        """Index of each incoming message within its link's order."""
        return {msg: i for msgs in self.incoming.values() for i, msg in enumerate(msgs)}


def message_tag(kind: str, stage: int, microbatch: int, microbatches: int) -> int:
    """A tag unique per (stage, kind, microbatch) within a step, so matching cannot cross."""
    return (2 * stage + (kind == GRAD)) * microbatches + microbatch


def _message(producer: int, forward: bool, microbatch: int, consumer: int,
             placement: tuple[int, ...], m: int) -> Message:
    kind = ACT if forward else GRAD
    return Message(kind, producer, microbatch, placement[producer], placement[consumer],
                   message_tag(kind, producer, microbatch, m))


def _sent(action: Action, placement: tuple[int, ...], m: int, pipelines: int) -> Optional[Message]:
    """The message carrying ``action``'s output, when the stage that waits for it is elsewhere."""
    s, kind, k = action
    to = consumer_stage(action, len(placement), pipelines)
    if to is None or not crosses_ranks(placement, s, to):
        return None
    return _message(s, kind == "F", k, to, placement, m)


def _needed(action: Action, placement: tuple[int, ...], m: int, pipelines: int) -> Optional[Message]:
    """The message ``action`` waits for, when its dependency ran on another rank."""
    dep = dependency(action, len(placement), pipelines)
    if dep is None or not crosses_ranks(placement, dep[0], action.stage):
        return None
    producer, kind, k = dep
    return _message(producer, kind == "F", k, action.stage, placement, m)


def plan_rank(schedule: Schedule, rank: int) -> RankPlan:
    """The communication plan of ``rank`` for one step of ``schedule``."""
    placement, m, copies = schedule.placement, schedule.microbatches, schedule.pipelines
    actions = schedule.rank_actions(rank)
    plan = RankPlan(
        rank,
        actions,
        sends=[_sent(a, placement, m, copies) for a in actions],
        needs=[_needed(a, placement, m, copies) for a in actions],
    )
    for src in range(schedule.ranks):
        if src == rank:
            continue
        link = [msg for a in schedule.rank_actions(src) if (msg := _sent(a, placement, m, copies)) and msg.dst == rank]
        if link:
            plan.incoming[src] = link
    plan.outgoing_peers = sorted({msg.dst for msg in plan.sends if msg is not None})
    return plan


def links(schedule: Schedule) -> list[tuple[int, int]]:
    """Every directed (src, dst) pair that carries at least one message, sorted."""
    pairs = set()
    for _rank, action in schedule.actions():
        msg = _sent(action, schedule.placement, schedule.microbatches, schedule.pipelines)
        if msg is not None:
            pairs.add((msg.src, msg.dst))
    return sorted(pairs)
