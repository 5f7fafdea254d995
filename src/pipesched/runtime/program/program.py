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

- ``UNSHARD`` / ``RESHARD``: gather a sharded stage's parameters ahead of its compute, free
  them once it leaves the window of stages coming next (no-ops on whole stages).

Lowering is a list of pure passes (:mod:`.passes`), torch's own in torch's order:
``_add_unshard_reshard``, ``_add_reduce_grad``, ``_add_send_recv``. For a compute-only
schedule torch lowers, the result is torch's own ``pipeline_order_with_comms``, cell for cell.

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

from dataclasses import replace
from typing import Optional, Sequence, Union

from ...actions import Action, Overlap, Slot, sub_actions
from ...errors import ScheduleError
from ...ops import SENDS, Op
from ...schedule import Schedule
from .instructions import Instruction, RankProgram
from .passes import compute_instruction, gathers_placed, lower_programs, needed_message, sent_message
from .program_check import check_programs


def lower(schedule: Schedule, rank: int) -> RankProgram:
    """Rank ``rank``'s program for one step of ``schedule`` (every rank's is derived at once,
    once per schedule object: see :func:`lower_all`)."""
    return lower_all(schedule)[rank]


def lower_all(schedule: Schedule) -> tuple[RankProgram, ...]:
    """Every rank's program, lowered by :data:`.passes.LOWERING` (module docstring); a schedule
    whose ranks cannot all progress is a DeadlockError naming each stuck rank, gathers placed by
    the schedule (:attr:`Schedule.gathers`) that break :func:`.program_check.check_programs`'
    rules a ScheduleError."""
    cached = schedule.derived.get("programs")
    if cached is None:
        programs = tuple(RankProgram(r, p) for r, p in enumerate(lower_programs(schedule)))
        if schedule.gathers is not None:  # placed elsewhere: checked, as a CSV's program is
            check_programs(programs)
        cached = schedule.derived["programs"] = programs
    return cached


def placing_gathers(schedule: Schedule, programs: Sequence[RankProgram]) -> Schedule:
    """``schedule`` carrying the ``UNSHARD``/``RESHARD`` placement of ``programs`` (one per rank:
    a ``compute_comms`` CSV's, :func:`~.planned_gathers.plan_programs`'), so that its lowering,
    and every runtime that runs it, gathers where they do; None in ``gathers`` if they place none."""
    placed = gathers_placed([p.instructions for p in programs])
    return replace(schedule, gathers=placed if any(placed) else None)


def links(schedule: Schedule) -> list[tuple[int, int]]:
    """Every directed (src, dst) pair of ranks that carries at least one message, sorted."""
    return sorted({(src, program.rank) for program in lower_all(schedule) for src in program.incoming()})


Step = Union[Slot, tuple[Op, int, Optional[int]]]  # a compute entry, or (op, stage, microbatch)


def assemble(schedule: Schedule, rank: int, steps: Sequence[Step]) -> RankProgram:
    """The program ``steps`` spell for ``rank`` (read from a ``compute_comms`` file): compute
    entries of ``schedule``, and the other instructions as ``(op, stage, microbatch)``. A SEND or
    RECV that carries no message of the schedule, or a stage instruction (REDUCE_GRAD, UNSHARD,
    RESHARD) naming a stage this rank does not hold, is a ScheduleError; whether the program is
    consistent and cannot hang is :func:`~.program_check.check_programs`' to say."""
    placement = schedule.placement
    out: list[Instruction] = []
    for step in steps:
        if isinstance(step, (Action, Overlap)):
            parts = sub_actions(step)
            for half, action in enumerate(parts, start=1 if len(parts) == 2 else 0):
                out.append(compute_instruction(action, half, schedule))
            continue
        op, stage, k = step
        if not 0 <= stage < len(placement):
            raise ScheduleError(f"rank {rank}: {stage}{op}{'' if k is None else k} names stage {stage}, which the schedule lacks")
        if k is None:
            if placement[stage] != rank:
                raise ScheduleError(f"rank {rank}: {stage}{op} names stage {stage}, which runs on rank {placement[stage]}")
            out.append(Instruction(op, stage))
            continue
        action = Action(stage, Op.F if op in (Op.SEND_F, Op.RECV_F) else Op.B, k)
        msg = (sent_message if op in SENDS else needed_message)(action, schedule)
        if msg is None or placement[stage] != rank:
            raise ScheduleError(
                f"rank {rank}: {stage}{op}{k} carries no message (stage {stage} runs on rank "
                f"{placement[stage]}; its neighbour that way is on the same rank or there is none)"
            )
        out.append(Instruction(op, stage, k, message=msg))
    return RankProgram(rank, tuple(out))
