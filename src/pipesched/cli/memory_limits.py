"""typer's declarations of the memory limits, one per flag and the same in every command that
takes it; what each means and how a value is read is :mod:`pipesched.memory_limits`."""

from __future__ import annotations

from ..memory_limits import ACTIVATION_LIMIT, MEMORY_LIMIT, RANK_MEMORY_LIMIT
from .declared import typer_option

MemoryLimit = typer_option(MEMORY_LIMIT)
ActivationLimit = typer_option(ACTIVATION_LIMIT)
RankMemoryLimit = typer_option(RANK_MEMORY_LIMIT)
