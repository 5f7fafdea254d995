"""Errors raised on bad input or bad schedules.

Every error is a ``ValueError`` subclass whose message is one line that names what is wrong and
what would be valid, so the CLI can print it as-is and exit with status 2.
"""

from __future__ import annotations


class PipeschedError(ValueError):
    """Base class: bad input to pipesched (the CLI prints the message and exits 2)."""


class ConfigError(PipeschedError):
    """An argument is out of range or inconsistent (ranks, microbatches, chunks, costs...)."""


class UnknownScheduleError(ConfigError):
    """A schedule name that is not registered."""


class CSVFormatError(PipeschedError):
    """A schedule CSV that cannot be parsed (names the row and the cell)."""


class ScheduleError(PipeschedError):
    """A schedule that breaks a structural rule (missing or duplicate actions, wrong order...)."""


class DeadlockError(ScheduleError):
    """A schedule in which some ranks wait forever (names each rank and what it waits for)."""


class RunFailure(RuntimeError):
    """Base class: a run that failed while running (a rank died or went silent, a loss or weight
    became non-finite, a checkpoint could not be written). Not bad input: the CLI prints the
    one-line message and exits 1."""
