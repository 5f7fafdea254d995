"""The instructions of a rank's program: compute actions, messages, reductions, gathers.

An :class:`Instruction` is one step of a rank's program in torch.distributed.pipelining's
lowered grammar (an :class:`~pipesched.ops.Op` on a stage, and a microbatch where it has one); a
:class:`Message` is one tensor list crossing ranks; a :class:`RankProgram` is what one rank runs in
one step. :mod:`.passes` builds them from a schedule, :mod:`.program` is the entry point, the
engine (:mod:`.engine`) runs them. Pure Python (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

from ...actions import Action, Overlap
from ...ops import RECEIVES, SENDS, Op

ACT, GRAD = "act", "grad"  # what a message carries: a stage's activation, or an input gradient


class Message(NamedTuple):
    """One tensor crossing ranks: ``kind`` ACT is the output of ``stage``'s F, GRAD the input
    gradient of ``stage``'s I/B, for ``microbatch``, from rank ``src`` to rank ``dst``."""

    kind: str
    stage: int
    microbatch: int
    src: int
    dst: int
    tag: int


def message_tag(kind: str, stage: int, microbatch: int, microbatches: int) -> int:
    """A tag unique per (stage, kind, microbatch) within a step, so matching cannot cross."""
    return (2 * stage + (kind == GRAD)) * microbatches + microbatch


class Instruction(NamedTuple):
    """One step of a rank's program; prints as torch's lowered action (``0F1``, ``1RECV_F1``).

    ``stage`` and ``microbatch`` are torch's ``stage_index`` and ``microbatch_index`` (None for
    ``REDUCE_GRAD``, ``UNSHARD`` and ``RESHARD``, which name a stage only). A compute instruction carries its ``action``; ``receives``: the message it
    consumes (an earlier RECV of this program posted it); ``sends``: the message the SEND right
    after it carries; ``local_input`` / ``local_output``: its input comes from, or its output
    goes to, another stage of this rank in memory. ``half``: 1 or 2 for the forward and backward
    halves of an overlapped pair (both inputs are received before the first), else 0. A SEND or
    RECV carries its ``message``.
    """

    op: Op
    stage: int
    microbatch: Optional[int] = None
    action: Optional[Action] = None
    message: Optional[Message] = None
    receives: Optional[Message] = None
    sends: Optional[Message] = None
    local_input: bool = False
    local_output: bool = False
    half: int = 0

    def __str__(self) -> str:
        return f"{self.stage}{self.op}{'' if self.microbatch is None else self.microbatch}"

    @property
    def peer(self) -> Optional[int]:
        """The rank at the other end of a SEND or RECV (None for the others)."""
        if self.message is None:
            return None
        return self.message.dst if self.op in SENDS else self.message.src


@dataclass(frozen=True)
class RankProgram:
    """What one rank runs in one step, in order."""

    rank: int
    instructions: tuple[Instruction, ...]

    @property
    def actions(self) -> list[Action]:
        """The compute actions in program order (an overlapped pair's forward, then backward)."""
        return [i.action for i in self.instructions if i.action is not None]

    def incoming(self) -> dict[int, list[Message]]:
        """Per source rank, the messages this rank receives, in the order its RECVs post them."""
        links: dict[int, list[Message]] = {}
        for i in self.instructions:
            if i.op in RECEIVES:
                links.setdefault(i.message.src, []).append(i.message)
        return links

    def peers(self) -> list[int]:
        """The ranks this rank sends to, sorted."""
        return sorted({i.message.dst for i in self.instructions if i.op in SENDS})

    def cells(self) -> list[str]:
        """The program as torch's ``compute_comms`` CSV cells (a pair's halves in one cell)."""
        cells: list[str] = []
        for i, ins in enumerate(self.instructions):
            if ins.half == 2:
                cells[-1] = str(Overlap(self.instructions[i - 1].action, ins.action))
            else:
                cells.append(str(ins))
        return cells
