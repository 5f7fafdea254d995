"""Where each rank gathers its sharded stages: torch's fixed window, or placed from the costs.

torch's lowering (:func:`.passes.add_unshard_reshard`) gives every rank the same window of 3
stages. ``auto`` places each rank's ``UNSHARD``s from the costs instead
(:func:`pipesched.gather_plan.gather_plan`: each all-gather issued as late as it still
lands before its stage's first action on the simulated timeline, the stage held until its last
action) and keeps, among that placement and torch's window at every width a rank could use,
the one whose program the simulator times fastest within the memory limit (the same time: the
placement, then the narrower window). So a rank of a schedule with more stages than the window
stops gathering the same stage again and again when memory allows, and holds fewer stages when
it does not.

The rules are asked, not restated here: what waits for what, and how gathers share a rank's
communication lane, is :func:`pipesched.execution.run`'s (given each action's gathers); what a
program holds gathered at once, and whether its gathers are consistent, is
:func:`.program_check.gathered_peak`'s; every candidate passes :func:`.program_check.check_programs`.
Pure Python: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Mapping, Optional, Sequence

from ...gather_plan import Gather, gather_plan
from ...costs import Costs, as_costs
from ...errors import ConfigError
from ...ops import Op
from ...placement import stages_by_rank
from ...schedule import Schedule
from ...simulate import simulate
from ...validate import validate
from .instructions import Instruction, RankProgram
from .passes import (
    Pass,
    Programs,
    add_reduce_grad,
    add_send_recv,
    add_unshard_reshard,
    entries,
    lower_programs,
)
from .program_check import check_programs, gathered_peak

GATHER_PLANS = ("torch", "auto")  # torch's window of 3; placed from the costs


@dataclass(frozen=True)
class GatherCosts:
    """What placing the gathers weighs: each stage's all-gather time (in the costs' unit) and,
    with ``limit``, its gathered bytes and the most a rank may hold gathered at once (bytes)."""

    time: Mapping[int, float]
    nbytes: Optional[Mapping[int, float]] = None
    limit: Optional[float] = None


@dataclass(frozen=True)
class PlannedPrograms:
    """The programs chosen, what placed their gathers (``auto`` or ``window N``), the simulated
    step with those gathers, and per rank the most bytes held gathered at once."""

    programs: tuple[RankProgram, ...]
    placement: str
    step_time: float
    peak_bytes: tuple[float, ...]


def placed_gathers(plans: Sequence[Mapping[int, Gather]]) -> Pass:
    """A lowering pass putting each rank's ``UNSHARD`` before the compute entry holding its plan's
    ``issue_before`` action (issued in the order the lane runs them) and its ``RESHARD`` after
    the entry holding ``release_after`` (actions counted as the simulator counts them: an
    overlapped pair's two halves are two)."""
    def add(programs: Programs, schedule: Schedule) -> Programs:
        return tuple(_placed(program, plans[r]) for r, program in enumerate(programs))
    return add


def _placed(program: Sequence[Instruction], plan: Mapping[int, Gather]) -> tuple[Instruction, ...]:
    entry_of = [e for e, entry in enumerate(entries(program)) for _ in entry]
    before: dict[int, list[Gather]] = {}
    after: dict[int, list[int]] = {}
    for g in sorted(plan.values(), key=lambda g: (g.start, g.stage)):
        before.setdefault(entry_of[g.issue_before], []).append(g)
        after.setdefault(entry_of[g.release_after], []).append(g.stage)
    out: list[Instruction] = []
    for e, entry in enumerate(entries(program)):
        out.extend(Instruction(Op.UNSHARD, g.stage) for g in before.get(e, ()))
        out.extend(entry)
        out.extend(Instruction(Op.RESHARD, s) for s in sorted(after.get(e, ())))
    return tuple(out)


def cost_placement(schedule: Schedule, costs: Costs, gather_time: Mapping[int, float]) -> Pass:
    """The pass placing every rank's gathers by :func:`gather_plan` against ``schedule``'s
    simulated timeline under ``costs`` (the ranks' waits included)."""
    plans = []
    for spans in simulate(schedule, costs).timeline:
        plans.append(gather_plan([tuple(s.action) for s in spans], [s.end - s.start for s in spans],
                                 gather_time, starts=[s.start for s in spans]))
    return placed_gathers(plans)


def gathered_step_time(schedule: Schedule, programs: Sequence[RankProgram], costs: Costs,
                       gather_time: Mapping[int, float]) -> float:
    """The simulated step of ``programs`` with their gathers on each rank's lane (the UNSHARDs
    before each compute entry are issued when the rank reaches it)."""
    program = schedule.program
    issued: list[tuple[tuple[int, float], ...]] = [()] * len(program.actions)
    for rank_program in programs:
        pending: list[tuple[int, float]] = []
        for ins in rank_program.instructions:
            if ins.op is Op.UNSHARD:
                pending.append((ins.stage, gather_time.get(ins.stage, 0.0)))
            elif ins.action is not None and ins.half != 2:
                issued[program.index[ins.action]] = tuple(pending)
                pending = []
    return simulate(schedule, costs, gathers=issued).makespan


def plan_programs(schedule: Schedule, gathers: Optional[GatherCosts] = None, costs: Optional[Costs] = None,
                  plan: str = "torch") -> PlannedPrograms:
    """Every rank's program with its gathers placed by ``plan`` (:data:`GATHER_PLANS`; see the
    module doc). ``torch`` is torch's window of 3 (``gathers`` then times it and holds it to the limit); ``auto``
    needs ``gathers`` and refuses, in one line, a schedule no candidate fits within its limit."""
    if plan not in GATHER_PLANS:
        raise ConfigError(f"--gather-plan {plan!r} is not known: use one of {', '.join(GATHER_PLANS)}")
    if plan == "auto" and gathers is None:
        raise ConfigError("--gather-plan auto needs each stage's all-gather time (--gather-time)")
    if schedule.gathers is not None:
        raise ConfigError(f"--gather-plan {plan} places the gathers, but {schedule.name} places them already "
                          "(its UNSHARD/RESHARD cells): run it as it is, or give its compute_only CSV")
    validate(schedule)
    costs = as_costs(costs)
    gathers = gathers or GatherCosts({})
    widest = max(len(stages) for stages in stages_by_rank(schedule.placement, schedule.ranks))
    if plan == "torch":
        candidates = [("window 3", add_unshard_reshard)]
    else:
        candidates = [("auto", cost_placement(schedule, costs, gathers.time))] + [
            (f"window {w}", partial(add_unshard_reshard, window=w)) for w in range(1, widest + 1)]
    chosen, over = None, []
    for label, placement in candidates:
        programs = _lowered(schedule, placement)
        check_programs(programs)
        peaks = [gathered_peak(p, gathers.nbytes or {}) for p in programs]
        if gathers.limit is not None and max(b for b, _ in peaks) > gathers.limit:
            over.append(max(peaks))
            continue
        found = PlannedPrograms(programs, label, gathered_step_time(schedule, programs, costs, gathers.time),
                                tuple(b for b, _ in peaks))
        if chosen is None or found.step_time < chosen.step_time:
            chosen = found
    if chosen is None:
        held, stages = min(over)
        raise ConfigError(f"the gathers do not fit the memory limit of {gathers.limit:.4g} bytes: the least a "
                          f"placement holds is {held:.4g} (stages {', '.join(map(str, stages))} at once); "
                          "give more memory or shard over more ranks")
    return chosen


def _lowered(schedule: Schedule, placement: Pass) -> tuple[RankProgram, ...]:
    programs = lower_programs(schedule, (placement, add_reduce_grad, add_send_recv))
    return tuple(RankProgram(r, p) for r, p in enumerate(programs))

