"""Is a schedule runnable? Structural rules, then a deadlock check under the execution model.

Structure: every action names a stage on its own rank and a microbatch in range; each
(stage, microbatch) has one ``F`` and either one ``B`` or one ``I`` and one ``W``; on its rank,
``F`` comes before the backward and ``I`` before ``W``; an overlapped pair never holds a
microbatch's backward together with that microbatch's forward of the same stage. Then the programs are executed under
:mod:`pipesched.execution` with unit costs: if some rank can never move, the schedule deadlocks.
"""

from __future__ import annotations

import numpy as np

from .actions import Action
from .costs import UNIT, program_durations
from .errors import ScheduleError
from .execution import Program, run
from .lowering import KINDS
from .ops import Op
from .schedule import Schedule


def check_structure(schedule: Schedule) -> None:
    """Raise ScheduleError naming the first broken rule; return None when the structure holds
    (checked once per schedule object: a schedule is immutable)."""
    if schedule.derived.get(STRUCTURE_HOLDS):
        return
    p, m, stages = schedule.ranks, schedule.microbatches, schedule.stages
    if p < 1 or m < 1:
        raise ScheduleError(f"a schedule needs ranks >= 1 and microbatches >= 1, got {p} and {m}")
    if len(schedule.orders) != p:
        raise ScheduleError(f"the schedule has {len(schedule.orders)} rank programs for {p} ranks")
    for stage, rank in enumerate(schedule.placement):
        if not 0 <= rank < p:
            raise ScheduleError(f"stage {stage} is placed on rank {rank}; ranks are 0..{p - 1}")
    if schedule.pipelines < 1 or stages % schedule.pipelines:
        raise ScheduleError(
            f"{stages} stages do not split into {schedule.pipelines} pipelines of equal length"
        )
    placement = schedule.placement
    runs = [schedule.stage_microbatches(s) for s in range(stages)]
    program = lowered(schedule)
    if not _placed_and_numbered(program, placement, runs) or _repeats(program):
        _explain_bad_actions(schedule, program, runs)
    if not _pairs_ok(program, runs):
        seen = program.index  # action -> id; ids grow along each rank's program
        for s in range(stages):
            for k in runs[s]:
                _check_pair(seen, placement[s], s, k)
    for rank in range(p):
        if not program.rank_ids[rank]:
            raise ScheduleError(f"rank {rank} has no actions: every rank must hold a stage")
    for a, b in enumerate(program.partner):
        if b >= 0 and program.dep[b] == a:
            raise ScheduleError(
                f"rank {program.rank_of[a]} overlaps {program.actions[a]} with {program.actions[b]}, "
                "which needs that forward's output: an overlapped pair's halves must be independent"
            )
    schedule.derived[STRUCTURE_HOLDS] = True


def _placed_and_numbered(program: Program, placement: tuple[int, ...], runs: list[range]) -> bool:
    """True when every action names a stage on its own rank and a microbatch its stage runs
    (``runs[s]``, consecutive: :func:`~pipesched.pipelines.pipeline_block`); array tests over
    the ids, not a Python test per action."""
    stage, micro = program.stage, program.micro
    if not ((stage >= 0) & (stage < len(placement))).all():
        return False
    ranks = np.repeat(np.arange(len(program.rank_ids)), [len(ids) for ids in program.rank_ids])
    first, stop = (np.array([getattr(r, end) for r in runs], np.int64) for end in ("start", "stop"))
    return bool((np.asarray(placement, np.int64)[stage] == ranks).all()
                and ((micro >= first[stage]) & (micro < stop[stage])).all())


def _repeats(program: Program) -> bool:
    """True when the programs hold some action twice (each placed and numbered: its stage, kind
    and microbatch make one key, counted by array)."""
    if not program.actions:
        return False
    key = (program.stage * (len(KINDS) + 1) + program.kind) * (int(program.micro.max()) + 1) + program.micro
    return bool(np.bincount(key).max() > 1)


def _pairs_ok(program: Program, runs: list[range]) -> bool:
    """True when every (stage, microbatch) its stage runs (``runs[s]``) has one ``F`` and either
    one ``B`` after it or an ``I`` after it and a ``W`` after that (:func:`_check_pair`'s rules;
    the program holds no action twice and none outside ``runs``): array lookups in a table of
    ids by (stage, kind, microbatch), -1 where none runs."""
    if not program.actions or (program.kind >= len(KINDS)).any():
        return False
    width = max(r.stop for r in runs)
    ids = np.full((len(runs), len(KINDS), width), -1, np.int64)
    ids[program.stage, program.kind, program.micro] = np.arange(len(program.actions))
    k = np.arange(width)
    ran = (k >= np.array([r.start for r in runs])[:, None]) & (k < np.array([r.stop for r in runs])[:, None])
    f, i, w, b = (ids[:, KINDS.index(kind)][ran] for kind in (Op.F, Op.I, Op.W, Op.B))
    full = (b > f) & (i < 0) & (w < 0)
    split = (b < 0) & (i > f) & (w > i)
    return bool(((f >= 0) & (full | split)).all())


def _explain_bad_actions(schedule: Schedule, program: Program, runs: list[range]) -> None:
    """Raise for the first action off its stage's rank, out of range, or repeated."""
    stages = schedule.stages
    once: set = set()
    for action, rank in zip(program.actions, program.rank_of):
        s, _kind, k = action
        if not 0 <= s < stages:
            raise ScheduleError(f"rank {rank} runs {action}: stage {s} is outside 0..{stages - 1}")
        if schedule.placement[s] != rank:
            raise ScheduleError(f"rank {rank} runs {action}, but stage {s} lives on rank {schedule.placement[s]}")
        if k not in runs[s]:
            run_of_stage = runs[s]
            raise ScheduleError(
                f"rank {rank} runs {action}: microbatch {k} is outside "
                f"{run_of_stage.start}..{run_of_stage.stop - 1}"
                + (" (its pipeline's microbatches)" if schedule.pipelines > 1 else "")
            )
        if action in once:
            raise ScheduleError(f"rank {rank} runs {action} twice")
        once.add(action)


def _check_pair(seen: dict, rank: int, s: int, k: int) -> None:
    f, b, i, w = (seen.get((s, kind, k)) for kind in (Op.F, Op.B, Op.I, Op.W))
    if f is None:
        raise ScheduleError(f"rank {rank} never runs {s}F{k}: every stage needs one forward per microbatch")
    if b is not None and (i is not None or w is not None):
        raise ScheduleError(f"rank {rank} runs both {s}B{k} and a split backward ({s}I{k}/{s}W{k})")
    if b is None and (i is None or w is None):
        missing = [str(Action(s, x, k)) for x, pos in ((Op.I, i), (Op.W, w)) if pos is None]
        if i is None and w is None:
            raise ScheduleError(f"rank {rank} never runs a backward of stage {s} for microbatch {k} ({s}B{k} or {s}I{k}+{s}W{k})")
        raise ScheduleError(f"rank {rank} is missing {', '.join(missing)}: a split backward needs both I and W")
    back = b if b is not None else i
    if back < f:
        kind = Op.B if b is not None else Op.I
        raise ScheduleError(f"rank {rank} runs {Action(s, kind, k)} before its forward {Action(s, Op.F, k)}")
    if w is not None and w < i:
        raise ScheduleError(f"rank {rank} runs {s}W{k} before {s}I{k}")


def lowered(schedule: Schedule) -> Program:
    """The schedule's programs lowered to ids (:attr:`Schedule.program`, computed once)."""
    return schedule.program


def check_deadlock(schedule: Schedule) -> None:
    """Raise DeadlockError if the programs cannot all finish under the execution model.

    The run uses unit costs; its times are kept so that a unit-cost simulation can reuse them.
    """
    program = lowered(schedule)
    durations = program_durations(program, UNIT)
    schedule.derived[UNIT_RUN] = (durations, *run(program, durations, 0.0))
    schedule.derived[FINISHED] = True


def validate(schedule: Schedule) -> Schedule:
    """Check structure and freedom from deadlock; return the schedule unchanged when valid.

    A schedule is immutable, so a schedule that passed once is not checked again. A run under
    any costs that finished (a builder's own simulation, :data:`FINISHED`) already proves it free
    of deadlock: whether a rank can move depends on which actions have ended, never on when
    (:func:`pipesched.execution.run`), so no second run is made.
    """
    if schedule.derived.get(VALIDATED):
        return schedule
    check_structure(schedule)
    if not schedule.derived.get(FINISHED):
        check_deadlock(schedule)
    schedule.derived[VALIDATED] = True
    return schedule


VALIDATED = "validated"  # Schedule.derived flag: structure and freedom from deadlock were checked
STRUCTURE_HOLDS = "structure_holds"  # Schedule.derived flag: check_structure passed
FINISHED = "finished"  # Schedule.derived flag: a run of these programs (under any costs) finished
UNIT_RUN = "unit_run"  # Schedule.derived: (durations, starts, ends) of the unit-cost run
