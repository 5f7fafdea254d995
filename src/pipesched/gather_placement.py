"""``--gather-plan``, ``--gather-time`` and ``--gather-limit``: where each rank gathers its
FSDP-sharded stages, for the two commands that place them (the options are declared once in
:mod:`pipesched.shared_options`).

``export`` writes the placement into a ``compute_comms`` CSV (torch's runtime runs it as
written); ``train`` runs it on pipesched's own runtime (the schedule carries it:
:func:`~pipesched.runtime.program.program.placing_gathers`). Both ask
:func:`~pipesched.runtime.program.planned_gathers.plan_programs` and say on stderr what it chose.
"""

from __future__ import annotations

import sys
from typing import Optional

from .bounds import check_number, number_list
from .costs import Costs
from .errors import ConfigError
from .schedule import Schedule

def gathers_asked(plan: str, times: Optional[str], limit: Optional[int]) -> bool:
    """Whether the flags ask for anything but torch's window (today's lowering)."""
    return plan != "torch" or times is not None or limit is not None


def planned_gathers(schedule: Schedule, costs: Optional[Costs], plan: str, times: Optional[str],
                    limit: Optional[int]) -> tuple:
    """Every rank's program with its gathers placed as the flags say (each flag checked in one
    line; the choice said on stderr)."""
    from .runtime.program.planned_gathers import GatherCosts, plan_programs

    if plan == "torch" and (times is not None or limit is not None):
        raise ConfigError("--gather-time and --gather-limit go with --gather-plan auto (torch's window uses neither)")
    values = number_list("--gather-time", times) if times is not None else None
    for value in values or ():
        check_number("--gather-time", value, 0.0, 1e9)
    if values is not None and len(values) not in (1, schedule.stages):
        raise ConfigError(f"--gather-time takes one value or one per stage ({schedule.stages}), got {len(values)}")
    if limit is not None and limit < 1:
        raise ConfigError(f"--gather-limit must be at least 1 stage, got {limit}")
    per_stage = None if values is None else {st: values[0 if len(values) == 1 else st] for st in range(schedule.stages)}
    gathers = None if per_stage is None else GatherCosts(per_stage, {st: 1.0 for st in per_stage}, limit)
    chosen = plan_programs(schedule, gathers, costs, plan)
    print(f"gathers placed by {chosen.placement}: simulated step {chosen.step_time:.4g}, at most "
          f"{max(chosen.peak_bytes):g} stages gathered at once on a rank", file=sys.stderr, flush=True)
    return chosen.programs
