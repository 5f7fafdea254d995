"""``--gather-plan``, ``--gather-time`` and ``--gather-limit``: where each rank gathers its
FSDP-sharded stages, declared once for the two commands that place them.

``export`` writes the placement into a ``compute_comms`` CSV (torch's runtime runs it as
written); ``train`` runs it on pipesched's own runtime (the schedule carries it:
:func:`~pipesched.runtime.program.program.placing_gathers`). Both ask
:func:`~pipesched.runtime.program.planned_gathers.plan_programs` and say on stderr what it chose.
"""

from __future__ import annotations

from typing import Optional

import typer

from ..bounds import check_number
from ..costs import Costs
from ..errors import ConfigError
from ..schedule import Schedule
from . import options as opt

GatherPlan = typer.Option(
    "torch", "--gather-plan",
    help="Where each rank gathers its FSDP-sharded stages (UNSHARD/RESHARD): torch: torch's window of the next 3 "
    "stages; auto: placed per rank from the costs and --gather-time, within --gather-limit.",
)
GatherTime = typer.Option(
    None, "--gather-time",
    help="With --gather-plan auto: one stage's all-gather time in cost units (one value, or one per stage).",
)
GatherLimit = typer.Option(
    None, "--gather-limit", help="With --gather-plan auto: the most stages a rank may hold gathered at once.")


def gathers_asked(plan: str, times: Optional[str], limit: Optional[int]) -> bool:
    """Whether the flags ask for anything but torch's window (today's lowering)."""
    return plan != "torch" or times is not None or limit is not None


def planned_gathers(schedule: Schedule, costs: Optional[Costs], plan: str, times: Optional[str],
                    limit: Optional[int]) -> tuple:
    """Every rank's program with its gathers placed as the flags say (each flag checked in one
    line; the choice said on stderr)."""
    from ..runtime.program.planned_gathers import GatherCosts, plan_programs

    if plan == "torch" and (times is not None or limit is not None):
        raise ConfigError("--gather-time and --gather-limit go with --gather-plan auto (torch's window uses neither)")
    values = opt.number_list("--gather-time", times) if times is not None else None
    for value in values or ():
        check_number("--gather-time", value, 0.0, 1e9)
    if values is not None and len(values) not in (1, schedule.stages):
        raise ConfigError(f"--gather-time takes one value or one per stage ({schedule.stages}), got {len(values)}")
    if limit is not None and limit < 1:
        raise ConfigError(f"--gather-limit must be at least 1 stage, got {limit}")
    per_stage = None if values is None else {st: values[0 if len(values) == 1 else st] for st in range(schedule.stages)}
    gathers = None if per_stage is None else GatherCosts(per_stage, {st: 1.0 for st in per_stage}, limit)
    chosen = plan_programs(schedule, gathers, costs, plan)
    typer.echo(f"gathers placed by {chosen.placement}: simulated step {chosen.step_time:.4g}, at most "
               f"{max(chosen.peak_bytes):g} stages gathered at once on a rank", err=True)
    return chosen.programs
