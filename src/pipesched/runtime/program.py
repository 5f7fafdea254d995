"""Each rank's program: its compute actions with every message and gradient reduction explicit.

Lowering a :class:`~pipesched.schedule.Schedule` gives every rank one list of
:class:`Instruction` in torch.distributed.pipelining's lowered grammar (what
``_PipelineScheduleRuntime`` runs, and its ``compute_comms`` CSV holds):

- ``F``, ``I``, ``W``, ``B``: a compute action (an overlapped pair's two halves follow each other,
  marked ``half`` 1 and 2; the CSV writes them as one ``(0F3;3B1)OVERLAP_F_B`` cell);
- ``SEND_F`` / ``SEND_B``, right after the action whose output another rank waits for (named by
  the producing stage: ``0SEND_F1`` after ``0F1``, ``1SEND_B0`` after ``1B0``);
- ``RECV_F`` / ``RECV_B``, placed on the receiving rank at the moment the send is placed (named
  by the receiving stage: ``1RECV_F1``, ``0RECV_B0``), so receives are posted in each link's
  order, ahead of the action that needs them;
- ``REDUCE_GRAD``, once per stage right after its last gradient action (``W``, or ``B``): from then
  on the stage's gradients are final and may be reduced.

Placement is torch's ``_add_send_recv`` (after ``_add_reduce_grad``): the ranks are walked round
robin, each placing its next entry once every input it needs has been produced somewhere; the
sender appends its SEND and, in the same breath, the receiver's RECV. For a compute-only
schedule torch lowers, the result is torch's own ``pipeline_order_with_comms`` minus its FSDP
no-ops (UNSHARD/RESHARD).

Why a run cannot hang: number the instructions in the order lowering appends them. A RECV
(number n+1) waits for its SEND (n), which sits on another rank behind instructions numbered
below n; a SEND that waits for its receiver (a rendezvous) waits for RECV n+1, behind
instructions numbered below n. By induction on the numbers, every instruction completes, even
when every receive blocks and every send waits for its receiver.
:func:`~.program_check.check_programs` runs programs under exactly those rules and fails
naming each stuck rank; the tests run it on every schedule family. Same-rank neighbours (the
turn of a V) hand tensors over in memory: no message.

This module is pure Python (no torch): programs can be built, written and checked anywhere.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence, Union

from ..actions import Action, Overlap, Slot, sub_actions
from ..errors import DeadlockError, ScheduleError
from ..execution import consumer_stage, crosses_ranks, dependency
from ..schedule import Schedule

ACT, GRAD = "act", "grad"  # what a message carries: a stage's activation, or an input gradient
SEND_F, RECV_F, SEND_B, RECV_B, REDUCE_GRAD = "SEND_F", "RECV_F", "SEND_B", "RECV_B", "REDUCE_GRAD"
COMPUTE_OPS = frozenset("FIWB")
SENDS = frozenset((SEND_F, SEND_B))
RECEIVES = frozenset((RECV_F, RECV_B))


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
    ``REDUCE_GRAD``). A compute instruction carries its ``action``; ``receives``: the message it
    consumes (an earlier RECV of this program posted it); ``sends``: the message the SEND right
    after it carries; ``local_input`` / ``local_output``: its input comes from, or its output
    goes to, another stage of this rank in memory. ``half``: 1 or 2 for the forward and backward
    halves of an overlapped pair (both inputs are received before the first), else 0. A SEND or
    RECV carries its ``message``.
    """

    op: str
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


def lower(schedule: Schedule, rank: int) -> RankProgram:
    """Rank ``rank``'s program for one step of ``schedule`` (every rank's is derived at once,
    once per schedule object: see :func:`lower_all`)."""
    return lower_all(schedule)[rank]


def lower_all(schedule: Schedule) -> tuple[RankProgram, ...]:
    """Every rank's program, placed as torch's ``_add_send_recv`` places them (module docstring);
    a schedule whose ranks cannot all progress is a DeadlockError naming each stuck rank."""
    cached = schedule.derived.get("programs")
    if cached is None:
        cached = schedule.derived["programs"] = _lower_all(schedule)
    return cached


def links(schedule: Schedule) -> list[tuple[int, int]]:
    """Every directed (src, dst) pair of ranks that carries at least one message, sorted."""
    return sorted({(src, program.rank) for program in lower_all(schedule) for src in program.incoming()})


def _lower_all(schedule: Schedule) -> tuple[RankProgram, ...]:
    placement, pipelines, m = schedule.placement, schedule.pipelines, schedule.microbatches
    stages = schedule.stages
    queues = [deque(_with_reductions(schedule, r)) for r in range(schedule.ranks)]
    out: list[list[Instruction]] = [[] for _ in range(schedule.ranks)]
    produced: set[tuple[int, str, int]] = set()  # (stage, "F" | "G" | "W", microbatch) placed

    def ready(action: Action) -> bool:
        dep = dependency(action, stages, pipelines)
        return dep is None or dep in produced

    while any(queues):
        progress = False
        for rank, queue in enumerate(queues):
            if not queue:
                continue
            entry = queue[0]
            if isinstance(entry, int):  # a stage whose gradients are final
                out[rank].append(Instruction(REDUCE_GRAD, entry))
            else:
                parts = sub_actions(entry)
                if not all(map(ready, parts)):
                    continue
                for half, action in enumerate(parts, start=1 if len(parts) == 2 else 0):
                    out[rank].append(_compute(action, half, placement, m, pipelines))
                for action in parts:
                    s, kind, k = action
                    produced.add((s, "G" if kind in "IB" else kind, k))
                    msg = _sent(action, placement, m, pipelines)
                    if msg is not None:
                        receiver = s + 1 if kind == "F" else s - 1
                        out[rank].append(Instruction(SEND_F if kind == "F" else SEND_B, s, k, message=msg))
                        out[msg.dst].append(Instruction(RECV_F if kind == "F" else RECV_B, receiver, k, message=msg))
            queue.popleft()
            progress = True
        if not progress:
            stuck = "; ".join(f"rank {r} at {q[0]}" for r, q in enumerate(queues) if q)
            raise DeadlockError(f"schedule deadlocks: no rank can place its next action ({stuck})")
    return tuple(RankProgram(r, tuple(ins)) for r, ins in enumerate(out))


def _with_reductions(schedule: Schedule, rank: int) -> list:
    """The rank's entries with, after each stage's last gradient action (W, or B; torch's
    ``_add_reduce_grad``), that stage's number (its REDUCE_GRAD)."""
    entries = schedule.rank_entries(rank)
    last: dict[int, int] = {}
    for i, entry in enumerate(entries):
        for s, kind, _k in sub_actions(entry):
            if kind in "WB":
                last[s] = i
    done_after: dict[int, list[int]] = {}
    for i, entry in enumerate(entries):  # stages in the order their last actions run
        for s, kind, _k in sub_actions(entry):
            if kind in "WB" and last[s] == i:
                done_after.setdefault(i, []).append(s)
    out: list = []
    for i, entry in enumerate(entries):
        out.append(entry)
        out.extend(done_after.get(i, ()))
    return out


def _compute(action: Action, half: int, placement: tuple[int, ...], m: int, pipelines: int) -> Instruction:
    s, kind, k = action
    dep = dependency(action, len(placement), pipelines)
    to = consumer_stage(action, len(placement), pipelines)
    return Instruction(
        kind, s, k, action=action,
        receives=_needed(action, placement, m, pipelines),
        sends=_sent(action, placement, m, pipelines),
        local_input=dep is not None and dep[0] != s and not crosses_ranks(placement, dep[0], s),
        local_output=to is not None and not crosses_ranks(placement, s, to),
        half=half,
    )


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


Step = Union[Slot, tuple[str, int, Optional[int]]]  # a compute entry, or (op, stage, microbatch)


def assemble(schedule: Schedule, rank: int, steps: Sequence[Step]) -> RankProgram:
    """The program ``steps`` spell for ``rank`` (read from a ``compute_comms`` file): compute
    entries of ``schedule``, and SEND, RECV and REDUCE_GRAD as ``(op, stage, microbatch)``. A
    SEND or RECV that carries no message of the schedule is a ScheduleError; whether the program
    is consistent and cannot hang is :func:`~.program_check.check_programs`' to say."""
    placement, pipelines, m = schedule.placement, schedule.pipelines, schedule.microbatches
    out: list[Instruction] = []
    for step in steps:
        if isinstance(step, (Action, Overlap)):
            parts = sub_actions(step)
            for half, action in enumerate(parts, start=1 if len(parts) == 2 else 0):
                out.append(_compute(action, half, placement, m, pipelines))
            continue
        op, stage, k = step
        if op == REDUCE_GRAD:
            out.append(Instruction(REDUCE_GRAD, stage))
            continue
        if not 0 <= stage < len(placement):
            raise ScheduleError(f"rank {rank}: {stage}{op}{k} names stage {stage}, which the schedule lacks")
        action = Action(stage, "F" if op in (SEND_F, RECV_F) else "B", k)
        msg = (_sent if op in SENDS else _needed)(action, placement, m, pipelines)
        if msg is None or placement[stage] != rank:
            raise ScheduleError(
                f"rank {rank}: {stage}{op}{k} carries no message (stage {stage} runs on rank "
                f"{placement[stage]}; its neighbour that way is on the same rank or there is none)"
            )
        out.append(Instruction(op, stage, k, message=msg))
    return RankProgram(rank, tuple(out))
