"""typer's declarations of ``--gather-plan``, ``--gather-time`` and ``--gather-limit``, for
``export`` (``train`` takes them through its run's tree); what they mean and how the gathers are
placed is :mod:`pipesched.gather_placement`."""

from __future__ import annotations

from ..shared_options import GATHER_LIMIT, GATHER_PLAN, GATHER_TIME
from .declared import typer_option

GatherPlan = typer_option(GATHER_PLAN)
GatherTime = typer_option(GATHER_TIME)
GatherLimit = typer_option(GATHER_LIMIT)
