"""What every renderer draws: per-rank executed spans, where stages live, and memory over time.

A simulated run gives one through :meth:`Timeline.from_sim`; a measured run (the runtime's
recorder) builds one directly from its ``Span(action, start, end)`` lists, in its own time unit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from ..execution import Span
from ..placement import stages_by_rank
from ..simulate import SimResult

Curve = tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Timeline:
    """Executed actions per rank (``spans[r]`` in start order) and the stage-to-rank placement.

    ``memory[r]``, when given, is rank r's activations over time as ``(time, level)`` steps, in
    ``memory_unit`` (M_B from the simulator, bytes measured by the runtime).
    ``comm[r]``, when given, is rank r's communication lane: ``(kind, stage, start, end)`` per
    collective (``AG`` all-gather, ``RS`` gradient reduction), drawn in a band of its own.
    ``unit`` names the time unit, for axis labels. ``pipelines`` > 1 (DualPipe's two model
    copies) says that the stages form that many pipelines, as in
    :class:`~pipesched.schedule.Schedule`: each is drawn in its own shade.
    """

    spans: tuple[tuple[Span, ...], ...]
    placement: tuple[int, ...]
    memory: Optional[tuple[Curve, ...]] = None
    name: str = "timeline"
    unit: str = "cost units"
    memory_unit: str = "M_B"
    pipelines: int = 1
    comm: Optional[tuple[tuple[tuple[str, int, float, float], ...], ...]] = None

    @classmethod
    def from_sim(cls, result: SimResult) -> "Timeline":
        sched = result.schedule
        curves = tuple(tuple(result.memory_curve(r)) for r in range(sched.ranks))
        return cls(result.timeline, sched.placement, curves, sched.name, pipelines=sched.pipelines)

    @property
    def ranks(self) -> int:
        return len(self.spans)

    @property
    def chunks(self) -> int:
        return max((len(s) for s in stages_by_rank(self.placement, self.ranks)), default=1)

    @property
    def microbatches(self) -> int:
        return 1 + max((s.action.microbatch for rs in self.spans for s in rs), default=-1)

    def shade_label(self, chunk: int) -> str:
        """What the shade of ``chunk`` (an index of :meth:`chunk_of_stage`) stands for: the
        chunk on its rank, or with several pipelines the pipeline and the rank it enters at."""
        if self.pipelines == 1:
            return f"chunk {chunk}"
        first = self.placement[chunk * (len(self.placement) // self.pipelines)]
        return f"pipeline {chunk} from rank {first}"

    def chunk_of_stage(self) -> list[int]:
        """Each stage's chunk index on its rank (0 for the rank's first stage). With several
        pipelines each rank holds one stage of each, which this numbers by pipeline: DualPipe's
        forward-direction copy is chunk 0 on every rank."""
        if self.pipelines > 1:
            length = len(self.placement) // self.pipelines
            return [s // length for s in range(len(self.placement))]
        chunk = [0] * len(self.placement)
        for stages in stages_by_rank(self.placement, self.ranks):
            for i, s in enumerate(sorted(stages)):
                chunk[s] = i
        return chunk

    @property
    def makespan(self) -> float:
        return max((rs[-1].end for rs in self.spans if rs), default=0.0)

    @property
    def end(self) -> float:
        """When the last action or collective ends (what the time axis covers)."""
        return max([self.makespan] + [c[3] for lane in self.comm or () for c in lane])

    @property
    def span(self) -> float:
        return max((rs[-1].end - rs[0].start for rs in self.spans if rs), default=0.0)

    @property
    def bubble_ratio(self) -> float:
        busy = sum(s.end - s.start for rs in self.spans for i, s in enumerate(rs)
                   if not overlaps_previous(rs, i))
        total = self.ranks * self.makespan
        return max(0.0, 1.0 - busy / total) if total > 0 else 0.0

    def peak_memory(self) -> Optional[list[float]]:
        if self.memory is None:
            return None
        return [max((level for _, level in curve), default=0.0) for curve in self.memory]


def overlaps_previous(spans, i: int) -> bool:
    """True when span ``i`` runs together with span ``i - 1`` of the same rank: the backward
    half of an overlapped forward and backward (OVERLAP_F_B), which share start and end."""
    if i == 0:
        return False
    this, before = spans[i], spans[i - 1]
    return this.end > this.start and this.start == before.start and this.end == before.end


def as_timeline(source: Union[Timeline, SimResult]) -> Timeline:
    """Accept either a simulation result or a ready timeline."""
    return source if isinstance(source, Timeline) else Timeline.from_sim(source)


def summary_line(timeline: Timeline) -> str:
    """The chart's title figures: p, m, v, makespan, span, bubble and peak memory."""
    parts = [
        f"p={timeline.ranks}  m={timeline.microbatches}  v={timeline.chunks}",
        f"makespan {timeline.makespan:.4g}",
        f"span {timeline.span:.4g}",
        f"bubble {100 * timeline.bubble_ratio:.1f}%",
    ]
    peaks = timeline.peak_memory()
    if peaks:
        parts.append(f"peak memory {max(peaks):.3g} {timeline.memory_unit}")
    return "   ".join(parts)

