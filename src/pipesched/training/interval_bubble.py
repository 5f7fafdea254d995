"""The bubble share of each logging interval of a pipeline run, measured and simulated
(:mod:`..metering.bubble_share`), from the action spans every rank's runtime already records.

Every rank keeps its spans of the interval's steps; at the interval's end one gather brings the
pipeline's (the first replica's ranks, in pipeline order) to rank 0, which computes the figures.
"""

from __future__ import annotations

from ..schedule import Schedule
from ..runtime.metering.bubble_share import bubble_figures
from .run_gather import gather_timelines


class IntervalBubble:
    """One rank's spans of the current interval, and the figures of each interval on rank 0."""

    def __init__(self, schedule: Schedule, pipeline: tuple[int, ...], comm: float, recomputed: frozenset) -> None:
        self.schedule, self.pipeline, self.comm, self.recomputed = schedule, pipeline, comm, recomputed
        self.steps: list = []

    def add(self, spans: list) -> None:
        """A step's spans on this rank."""
        self.steps.append(spans)

    def figures(self) -> dict:
        """The interval's fields on rank 0 (empty elsewhere), its spans then dropped. Collective."""
        timelines = gather_timelines(self.steps, self.pipeline)
        self.steps = []
        return bubble_figures(self.schedule, timelines, self.comm, self.recomputed) if timelines else {}
