"""pipesched: pipeline-parallel schedules you can build, simulate, draw, choose and run.

>>> import pipesched
>>> s = pipesched.build_schedule("zb-v", ranks=4, microbatches=8)
>>> r = pipesched.simulate(s, pipesched.Costs(F=1, B=1, W=1))
>>> r.span
24.0

The planning layers (this package minus ``pipesched.runtime``) import no torch.
"""

from .actions import Action
from .costs import Costs
from .errors import (
    CSVFormatError,
    ConfigError,
    DeadlockError,
    PipeschedError,
    ScheduleError,
    UnknownScheduleError,
)
from .registry import build_schedule, families, get_family, schedule_names
from .schedule import Schedule
from .schedules import builtin as _builtin  # noqa: F401  (registers the built-in families)
from .simulate import SimResult, simulate
from .validate import validate
from .resolve import RunSpec, ScheduleChoice, resolve_schedule  # noqa: E402  (after the families register)

__version__ = "0.1.0"

__all__ = [
    "Action",
    "Costs",
    "CSVFormatError",
    "ConfigError",
    "DeadlockError",
    "PipeschedError",
    "RunSpec",
    "Schedule",
    "ScheduleChoice",
    "ScheduleError",
    "SimResult",
    "UnknownScheduleError",
    "build_schedule",
    "families",
    "get_family",
    "resolve_schedule",
    "schedule_names",
    "simulate",
    "validate",
]
