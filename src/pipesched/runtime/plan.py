"""Each rank's actions with the message each sends and the one each needs, read off its program.

The engine's per-action view of :mod:`.program` (which places every send and receive and says
why a run cannot hang): for each compute action, the message it sends and the one it waits for,
and per incoming link the messages in the order the program's receives post them (the order the
sender sends them).

This module is pure Python (no torch): the plan can be inspected and tested anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..actions import Action
from ..schedule import Schedule
from .program import ACT, GRAD, Message, links, lower

__all__ = ["ACT", "GRAD", "Message", "RankPlan", "links", "plan_rank"]


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


def plan_rank(schedule: Schedule, rank: int) -> RankPlan:
    """The communication plan of ``rank`` for one step of ``schedule``."""
    program = lower(schedule, rank)
    compute = [i for i in program.instructions if i.action is not None]
    return RankPlan(
        rank,
        [i.action for i in compute],
        sends=[i.sends for i in compute],
        needs=[i.receives for i in compute],
        incoming=program.incoming(),
        outgoing_peers=program.peers(),
    )
