"""Checking programs: they run to the end when every receive blocks and every send waits for its
receiver, messages are received once and in each link's order, and each stage reduces once.

:mod:`.program`'s lowering cannot fail these checks (its docstring says why); they make the
argument a test, and they vet programs that come from elsewhere (a ``compute_comms`` CSV).
Pure Python (no torch).
"""

from __future__ import annotations

from collections import deque
from typing import Mapping, Optional, Sequence

from ...errors import DeadlockError, ScheduleError
from ...ops import RECEIVES, SENDS, Op
from .instructions import Message, RankProgram


def check_programs(programs: Sequence[RankProgram]) -> None:
    """Run the programs as strictly as a transport may: every RECV blocks until its SEND is
    posted and every SEND until its RECV is (a rendezvous), one instruction at a time per rank.
    Raises ScheduleError when a message is sent before it is computed, received twice or out
    of its link's order, consumed before its RECV, or a stage is reduced before its last
    gradient action (or not once), and
    DeadlockError naming each stuck rank's instruction when the programs cannot all finish.
    Whatever finishes under these rules finishes when sends are buffered, too."""
    heads = [0] * len(programs)
    received: list[set[Message]] = [set() for _ in programs]
    produced: list[set[Message]] = [set() for _ in programs]
    reduced: list[set[int]] = [set() for _ in programs]
    _check_link_order(programs)
    runnable = deque(range(len(programs)))
    while runnable:
        r = runnable.popleft()
        code = programs[r].instructions
        while heads[r] < len(code):
            ins = code[heads[r]]
            if ins.op in SENDS or ins.op in RECEIVES:
                peer = ins.peer
                if not 0 <= peer < len(programs):
                    raise ScheduleError(f"rank {r}: {ins} names rank {peer}, which does not exist")
                other = programs[peer].instructions
                mate = other[heads[peer]] if heads[peer] < len(other) else None
                if mate is None or mate.message != ins.message or (mate.op in SENDS) == (ins.op in SENDS):
                    break  # waits for its peer to reach the matching instruction
                sender, receiver = (peer, r) if ins.op in RECEIVES else (r, peer)
                if ins.message not in produced[sender]:
                    raise ScheduleError(f"rank {sender} sends {_what(ins.message)} before the action that computes it")
                if ins.message in received[receiver]:
                    raise ScheduleError(f"rank {receiver} receives {_what(ins.message)} twice")
                received[receiver].add(ins.message)
                heads[peer] += 1
                runnable.append(peer)
            elif ins.op is Op.REDUCE_GRAD:
                _check_reduction(programs[r], heads[r], ins.stage)
                if ins.stage in reduced[r]:
                    raise ScheduleError(f"rank {r} reduces stage {ins.stage} twice")
                reduced[r].add(ins.stage)
            else:
                if ins.receives is not None and ins.receives not in received[r]:
                    raise ScheduleError(f"rank {r} runs {ins} before receiving its input, {_what(ins.receives)}")
                if ins.sends is not None:
                    produced[r].add(ins.sends)
            heads[r] += 1
    stuck = [r for r, program in enumerate(programs) if heads[r] < len(program.instructions)]
    if stuck:
        raise DeadlockError("program hangs: " + "; ".join(
            f"rank {r} waits at {programs[r].instructions[heads[r]]} (instruction {heads[r]})" for r in stuck))
    for program in programs:
        missing = {a.stage for a in program.actions if a.kind.adds_weight_grads} - reduced[program.rank]
        if missing:
            raise ScheduleError(f"rank {program.rank} never reduces the gradients of stages {sorted(missing)}")
        _check_gathers(program)


def _check_link_order(programs: Sequence[RankProgram]) -> None:
    """Every message sent is received, and on every link in the order the sender sends."""
    sent: dict[tuple[int, int], list[Message]] = {}
    received: dict[tuple[int, int], list[Message]] = {}
    for program in programs:
        for i in program.instructions:
            if i.op in SENDS:
                sent.setdefault((program.rank, i.message.dst), []).append(i.message)
            elif i.op in RECEIVES:
                received.setdefault((i.message.src, program.rank), []).append(i.message)
    for (src, dst) in sorted(set(sent) | set(received)):
        out, into = sent.get((src, dst), []), received.get((src, dst), [])
        taken, given = set(into), set(out)
        lost = [m for m in out if m not in taken]
        if lost:
            raise ScheduleError(f"rank {src} sends {_what(lost[0])} to rank {dst}, which never receives it")
        unsent = [m for m in into if m not in given]
        if unsent:
            raise ScheduleError(f"rank {dst} receives {_what(unsent[0])} from rank {src}, which never sends it")
        if out != into:
            raise ScheduleError(f"link {src}->{dst}: rank {dst} receives in another order than rank {src} sends")


def _what(msg: Message) -> str:
    """``the activation of stage 0 microbatch 1`` (or its input gradient)."""
    return f"the {'activation' if msg.kind == 'act' else 'input gradient'} of stage {msg.stage} microbatch {msg.microbatch}"


def gathered_peak(program: RankProgram, nbytes: Mapping[int, float]) -> tuple[float, tuple[int, ...]]:
    """The most bytes ``program`` holds gathered at once (UNSHARD takes a stage's ``nbytes`` when
    issued, RESHARD gives them back) and the stages held then; the program's gathers checked as
    :func:`check_programs` checks them (a ScheduleError names what is wrong)."""
    return _check_gathers(program, nbytes)


def _check_gathers(program: RankProgram, nbytes: Optional[Mapping[int, float]] = None) -> tuple[float, tuple[int, ...]]:
    """A program with UNSHARD/RESHARD computes each stage only while it is gathered: after its
    UNSHARD, before the RESHARD that follows; a stage is gathered once at a time and freed by the
    end. Returns the peak of ``nbytes`` gathered at once and the stages then (0 without sizes)."""
    peak: tuple[float, tuple[int, ...]] = (0.0, ())
    if not any(ins.op is Op.UNSHARD or ins.op is Op.RESHARD for ins in program.instructions):
        return peak
    gathered: set[int] = set()
    for ins in program.instructions:
        if ins.op is Op.UNSHARD or ins.op is Op.RESHARD:
            unshard = ins.op is Op.UNSHARD
            if (ins.stage in gathered) == unshard:
                state = "gathered" if unshard else "not gathered"
                raise ScheduleError(f"rank {program.rank}: {ins} while stage {ins.stage} is {state}")
            (gathered.add if unshard else gathered.discard)(ins.stage)
            held = sum(nbytes.get(s, 0.0) for s in gathered) if nbytes is not None else 0.0
            if held > peak[0]:
                peak = (held, tuple(sorted(gathered)))
        elif ins.action is not None and ins.stage not in gathered:
            raise ScheduleError(f"rank {program.rank} runs {ins} while stage {ins.stage} is not gathered (no UNSHARD before it)")
    if gathered:
        raise ScheduleError(f"rank {program.rank} ends with stages {sorted(gathered)} still gathered (no RESHARD)")
    return peak


def _check_reduction(program: RankProgram, at: int, stage: int) -> None:
    later = [i.action for i in program.instructions[at:] if i.action is not None
             and i.action.stage == stage and i.action.kind.adds_weight_grads]
    if later:
        raise ScheduleError(f"rank {program.rank} reduces stage {stage} before its {later[0]}")
