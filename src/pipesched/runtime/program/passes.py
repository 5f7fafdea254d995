"""Lowering as a list of pure passes: a schedule's compute orders to every rank's full program.

Each pass takes every rank's instructions and returns new ones (``Programs -> Programs``), as
torch.distributed.pipelining lowers a compute-only schedule:

1. :func:`add_unshard_reshard` (torch's ``_add_unshard_reshard``): before each compute, gather
   the next ``window`` distinct stages this rank will compute and free the others (FSDP's
   all-gathers issued ahead of the compute that needs them; no-ops on whole stages);
2. :func:`add_reduce_grad` (torch's ``_add_reduce_grad``): a stage's ``REDUCE_GRAD`` right after
   the action that completes its ``m``-th gradient pass (``W``, or ``B``);
3. :func:`add_send_recv` (torch's ``_add_send_recv``): the ranks walked round robin, each placing
   its next entry once every input it needs has been produced somewhere; the sender appends its
   SEND and, in the same breath, the receiver's RECV.

:data:`LOWERING` lists them in torch's order; a new instruction is one more pass here (and one
handler in the engine). What waits for what is :func:`pipesched.execution.dependency`'s to say,
here as in the simulator. Pure Python: no torch.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ...actions import Action, sub_actions
from ...dependencies import Output, consumer_stage, dependency, produced
from ...errors import DeadlockError, ScheduleError
from ...execution import crosses_ranks
from ...ops import Op
from ...schedule import Schedule
from .instructions import ACT, GRAD, Instruction, Message, message_tag

Programs = tuple[tuple[Instruction, ...], ...]  # per rank, in order
Pass = Callable[[Programs, Schedule], Programs]
UNSHARD_WINDOW = 3  # torch's max_active_stages
_GATHER_OPS = (Op.UNSHARD, Op.RESHARD)


def compute_programs(schedule: Schedule) -> Programs:
    """Every rank's compute instructions (an overlapped pair's halves in a row, ``half`` 1 and 2),
    with the ``UNSHARD``/``RESHARD`` the schedule places (:attr:`Schedule.gathers`), if it does."""
    programs = []
    for rank in range(schedule.ranks):
        placed = schedule.gathers[rank] if schedule.gathers is not None else ()
        entries = schedule.rank_entries(rank)
        if any(not 0 <= e <= len(entries) for e, _, _ in placed):
            raise ScheduleError(f"rank {rank}: the gathers are placed for another program "
                                f"(an entry past the rank's {len(entries)} compute entries)")
        before: dict[int, list[Instruction]] = {}
        for e, op, stage in placed:
            before.setdefault(e, []).append(Instruction(op, stage))
        out: list[Instruction] = []
        for e, entry in enumerate(entries):
            out.extend(before.get(e, ()))
            parts = sub_actions(entry)
            for half, action in enumerate(parts, start=1 if len(parts) == 2 else 0):
                out.append(compute_instruction(action, half, schedule))
        out.extend(before.get(len(entries), ()))
        programs.append(tuple(out))
    return tuple(programs)


def gathers_placed(programs: Sequence[Sequence[Instruction]]) -> tuple[tuple[tuple[int, Op, int], ...], ...]:
    """Where ``programs`` place their ``UNSHARD``/``RESHARD`` (:attr:`Schedule.gathers`: before
    which compute entry), what :func:`compute_programs` puts back."""
    out = []
    for program in programs:
        computed, placed = 0, []
        for ins in program:
            if ins.op in _GATHER_OPS:
                placed.append((computed, ins.op, ins.stage))
            elif ins.op.is_compute and ins.half != 2:
                computed += 1
        out.append(tuple(placed))
    return tuple(out)


def entries(program: Sequence[Instruction]) -> list[tuple[Instruction, ...]]:
    """The program's entries: a compute instruction, an overlapped pair's two halves, or another op."""
    out: list[tuple[Instruction, ...]] = []
    for ins in program:
        if ins.half == 2:
            out[-1] = (*out[-1], ins)
        else:
            out.append((ins,))
    return out


def add_unshard_reshard(programs: Programs, schedule: Schedule, window: int = UNSHARD_WINDOW) -> Programs:
    """Before each compute entry, UNSHARD the next ``window`` distinct stages of the rank's compute
    not yet gathered (in the order they come) after RESHARDing the gathered ones outside that window;
    every stage still gathered at the end is resharded (torch's pass, cell for cell: its
    eviction walks a ``set`` of stage numbers, and so does this one). A schedule that places its
    gathers itself (a CSV's, a plan's: :attr:`Schedule.gathers`) keeps them as placed."""
    if schedule.gathers is not None:
        return programs
    return tuple(_unshard_reshard(program, window) for program in programs)


def _unshard_reshard(program: Sequence[Instruction], window: int) -> tuple[Instruction, ...]:
    computes = [entry for entry in entries(program) if entry[0].op.is_compute]
    active: set[int] = set()
    out: list[Instruction] = []
    for i, entry in enumerate(computes):
        upcoming = _next_stages(computes[i:], window)
        for stage in [s for s in active if s not in upcoming]:
            active.remove(stage)
            out.append(Instruction(Op.RESHARD, stage))
        for stage in [s for s in upcoming if s not in active]:
            active.add(stage)
            out.append(Instruction(Op.UNSHARD, stage))
        out.extend(entry)
    for stage in list(active):
        out.append(Instruction(Op.RESHARD, stage))
    return tuple(out)


def _next_stages(upcoming: Sequence[tuple[Instruction, ...]], count: int) -> list[int]:
    """The first ``count`` distinct stages of the compute entries ahead (an overlapped pair adds
    both its stages before the count is checked, as torch's pass does)."""
    seen: list[int] = []
    for entry in upcoming:
        for ins in entry:
            if ins.stage not in seen:
                seen.append(ins.stage)
                if len(entry) == 1 and len(seen) == count:
                    return seen
        if len(seen) >= count:
            break
    return seen


def add_reduce_grad(programs: Programs, schedule: Schedule) -> Programs:
    """After the entry that completes a stage's last ``W`` or ``B`` (its ``m``-th; with DualPipe's
    two model copies, each stage sees its own direction's share), that stage's REDUCE_GRAD: from
    then on its gradients are final."""
    out = []
    for program in programs:
        left: dict[int, int] = {}
        for ins in program:
            if ins.op.adds_weight_grads:
                left[ins.stage] = left.get(ins.stage, 0) + 1
        placed: list[Instruction] = []
        for entry in entries(program):
            placed.extend(entry)
            for ins in entry:
                if ins.op.adds_weight_grads:
                    left[ins.stage] -= 1
                    if not left[ins.stage]:
                        placed.append(Instruction(Op.REDUCE_GRAD, ins.stage))
        out.append(tuple(placed))
    return tuple(out)


def add_send_recv(programs: Programs, schedule: Schedule) -> Programs:
    """SENDs right after the compute whose output another rank waits for, and the receiver's RECV
    placed at that moment (module docstring); a program whose ranks cannot all progress is a
    DeadlockError naming each stuck rank."""
    stages, pipelines = schedule.stages, schedule.pipelines
    queues = [entries(program) for program in programs]
    heads = [0] * len(queues)
    out: list[list[Instruction]] = [[] for _ in queues]
    placed: set[tuple] = set()  # (stage, Output, microbatch) made by an entry placed somewhere
    while any(head < len(queue) for head, queue in zip(heads, queues)):
        progress = False
        for rank, queue in enumerate(queues):
            if heads[rank] == len(queue):
                continue
            entry = queue[heads[rank]]
            needs = [dependency(ins.action, stages, pipelines) for ins in entry if ins.action is not None]
            if not all(need is None or need in placed for need in needs):
                continue
            out[rank].extend(entry)  # an overlapped pair's halves stay together, its sends after both
            for ins in entry:
                if ins.action is None:
                    continue
                s, kind, k = ins.action
                placed.add(produced(ins.action))
                if ins.sends is not None:
                    forward = kind is Op.F
                    out[rank].append(Instruction(Op.SEND_F if forward else Op.SEND_B, s, k, message=ins.sends))
                    out[ins.sends.dst].append(Instruction(Op.RECV_F if forward else Op.RECV_B,
                                                          s + 1 if forward else s - 1, k, message=ins.sends))
            heads[rank] += 1
            progress = True
        if not progress:
            stuck = "; ".join(f"rank {r} at {_shown(q[h])}" for r, (q, h) in enumerate(zip(queues, heads)) if h < len(q))
            raise DeadlockError(f"schedule deadlocks: no rank can place its next action ({stuck})")
    return tuple(tuple(program) for program in out)


LOWERING: tuple[Pass, ...] = (add_unshard_reshard, add_reduce_grad, add_send_recv)


def lower_programs(schedule: Schedule, passes: Sequence[Pass] = LOWERING) -> Programs:
    """``schedule``'s compute instructions run through ``passes`` in order."""
    programs = compute_programs(schedule)
    for lowering_pass in passes:
        programs = lowering_pass(programs, schedule)
    return programs


def _shown(entry: tuple[Instruction, ...]) -> str:
    if len(entry) == 2:
        return f"({entry[0]};{entry[1]})OVERLAP_F_B"
    return str(entry[0])


def compute_instruction(action: Action, half: int, schedule: Schedule) -> Instruction:
    """``action``'s instruction: the message it waits for and the one it sends, if they cross ranks."""
    placement, pipelines = schedule.placement, schedule.pipelines
    s = action.stage
    dep = dependency(action, len(placement), pipelines)
    to = consumer_stage(action, len(placement), pipelines)
    return Instruction(
        action.kind, s, action.microbatch, action=action,
        receives=needed_message(action, schedule),
        sends=sent_message(action, schedule),
        local_input=dep is not None and dep[0] != s and not crosses_ranks(placement, dep[0], s),
        local_output=to is not None and not crosses_ranks(placement, s, to),
        half=half,
    )


def _message(producer: int, forward: bool, microbatch: int, consumer: int, schedule: Schedule) -> Message:
    kind = ACT if forward else GRAD
    placement = schedule.placement
    return Message(kind, producer, microbatch, placement[producer], placement[consumer],
                   message_tag(kind, producer, microbatch, schedule.microbatches))


def sent_message(action: Action, schedule: Schedule) -> Message | None:
    """The message carrying ``action``'s output, when the stage that waits for it is elsewhere."""
    to = consumer_stage(action, schedule.stages, schedule.pipelines)
    if to is None or not crosses_ranks(schedule.placement, action.stage, to):
        return None
    return _message(action.stage, action.kind is Op.F, action.microbatch, to, schedule)


def needed_message(action: Action, schedule: Schedule) -> Message | None:
    """The message ``action`` waits for, when its dependency ran on another rank."""
    dep = dependency(action, schedule.stages, schedule.pipelines)
    if dep is None or not crosses_ranks(schedule.placement, dep[0], action.stage):
        return None
    producer, kind, k = dep
    return _message(producer, kind is Output.ACTIVATION, k, action.stage, schedule)
