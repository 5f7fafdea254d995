"""Measured timelines: median action costs, the simulator's prediction from them, and JSON output.

A timeline has the simulator's shape, ``list[list[Span]]`` (one list per rank, times in seconds
from the step's synchronised start), so the same renderers draw measured and simulated runs.
Pure Python: no torch.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ...execution import Span, execute, run
from ...jsontext import json_text
from ...schedule import Schedule
from ...validate import lowered

Timeline = list[list[Span]]


@dataclass(frozen=True)
class Comparison:
    """Measured step (median over steps) against the simulator fed with measured costs.

    ``ratio`` compares with one replay using the median cost of every (stage, kind), what a
    planner would predict; ``replay_ratio`` replays every step with its own actions' measured
    durations, so that it counts only the time the runtime adds between actions (waits beyond
    the p2p latency, its own bookkeeping), not the spread of the actions' durations.
    """

    measured_makespan: float
    measured_bubble: float
    simulated_makespan: float
    simulated_bubble: float
    comm: float
    kind_costs: dict[str, float]  # median per action kind, all stages together, seconds
    replay_ratio: float = float("nan")  # median over steps of measured / replayed makespan

    @property
    def ratio(self) -> float:
        return self.measured_makespan / self.simulated_makespan


def makespan(timeline: Timeline) -> float:
    return max((r[-1].end for r in timeline if r), default=0.0)


def bubble(timeline: Timeline) -> float:
    """1 - busy / (ranks * makespan), over the actions' spans."""
    busy = sum(s.end - s.start for r in timeline for s in r)
    return 1.0 - busy / (len(timeline) * makespan(timeline))


def _durations(steps: Sequence[Timeline]) -> dict[tuple[int, str], list[float]]:
    samples: dict[tuple[int, str], list[float]] = {}
    for timeline in steps:
        for rank in timeline:
            for span in rank:
                samples.setdefault((span.action.stage, span.action.kind), []).append(span.end - span.start)
    return samples


def median_costs(steps: Sequence[Timeline]) -> dict[tuple[int, str], float]:
    """Median duration of each (stage, kind) over every microbatch of every step."""
    return {key: statistics.median(values) for key, values in _durations(steps).items()}


def mean_costs(steps: Sequence[Timeline]) -> dict[tuple[int, str], float]:
    """Mean duration of each (stage, kind) over every microbatch of every step.

    The cost to replay a step with when the durations are skewed: a makespan is a sum of
    durations along the critical path, and on a time-shared CPU an action that loses its core
    takes several times its usual time, so the median (the usual action) underestimates that
    sum while the mean counts the preemptions at the rate they happen."""
    return {key: statistics.fmean(values) for key, values in _durations(steps).items()}


def replayed_makespan(schedule: Schedule, timeline: Timeline, comm: float) -> float:
    """The step's makespan had every action started as soon as the execution model allows
    (its rank free, its input produced plus ``comm`` across ranks), each taking the duration it
    was measured to take in this step."""
    durations = {span.action: span.end - span.start for rank in timeline for span in rank}
    program = lowered(schedule)  # lowered once per schedule: calibration replays it many times
    _, ends = run(program, [durations[a] for a in program.actions], comm)
    return max(ends, default=0.0)


def calibrated_comm(schedule: Schedule, steps: Sequence[Timeline], floor: float) -> float:
    """The per-message delay with which the simulator's execution model, fed every step's own
    action durations, ends the steps when they really ended (medians over steps).

    What a cross-rank message costs between actions in practice: the transfer, posting its
    receive, waking the receiver. On CPUs over gloo that is several times the one-way latency a
    ping-pong measures (``floor``, the least this returns), and schedules that exchange many
    messages pay it many times.
    """
    target = statistics.median(makespan(t) for t in steps)

    def replayed(comm: float) -> float:
        return statistics.median(replayed_makespan(schedule, t, comm) for t in steps)

    if replayed(floor) >= target:
        return floor
    lo, hi = floor, floor + target  # a delay as long as the step ends it later than measured
    if replayed(hi) < target:  # no message on any path (one rank): the delay cannot matter
        return floor
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if replayed(mid) < target else (lo, mid)
    return hi


def compare_to_simulation(schedule: Schedule, steps: Sequence[Timeline], comm: float) -> Comparison:
    """Replay the schedule in the simulator's execution model with the measured median cost of
    every (stage, kind) and the measured p2p latency; compare with the measured steps."""
    costs = median_costs(steps)
    predicted = predicted_timeline(schedule, costs, comm)
    by_kind: dict[str, list[float]] = {}
    for (_, kind), value in costs.items():
        by_kind.setdefault(kind, []).append(value)
    return Comparison(
        measured_makespan=statistics.median(makespan(t) for t in steps),
        measured_bubble=statistics.median(bubble(t) for t in steps),
        simulated_makespan=makespan(predicted),
        simulated_bubble=bubble(predicted),
        comm=comm,
        kind_costs={k: statistics.median(v) for k, v in sorted(by_kind.items())},
        replay_ratio=statistics.median(makespan(t) / replayed_makespan(schedule, t, comm) for t in steps),
    )


def predicted_timeline(schedule: Schedule, costs: dict[tuple[int, str], float], comm: float) -> Timeline:
    """The schedule replayed in the simulator's execution model with ``costs`` per (stage, kind)
    (seconds, e.g. :func:`median_costs`) and ``comm`` seconds a transfer."""
    orders = [schedule.rank_actions(r) for r in range(schedule.ranks)]
    return execute(orders, schedule.placement, lambda a: costs[(a.stage, a.kind)], comm, schedule.pipelines)


def median_step(steps: Sequence[Timeline]) -> int:
    """Index of the step whose makespan is the median (the one worth drawing)."""
    order = sorted(range(len(steps)), key=lambda i: makespan(steps[i]))
    return order[len(order) // 2]


def steps_json(steps: Sequence[Timeline]) -> list:
    """Every step's per-rank spans as plain JSON (action string, start, end in seconds)."""
    return [[[[str(s.action), s.start, s.end] for s in rank] for rank in t] for t in steps]


def write_trace(path: Path, schedule: Schedule, steps: Sequence[Timeline], memory: Sequence = ()) -> int:
    """Write a Perfetto / Chrome trace of the median step (after the first, warm-up step);
    every step's spans ride along in ``otherData.measured_steps``. ``memory``, per step and
    rank, the (seconds, activation bytes held) the runtime measured: a counter track per rank.
    Returns the step drawn."""
    from ...outfiles import write_atomic
    from ...render.timeline import Timeline as DrawnTimeline
    from ...render.trace import trace_events

    skip = 1 if len(steps) > 1 else 0
    measured = list(steps[skip:])
    index = median_step(measured)
    curves = tuple(tuple(curve) for curve in memory[index + skip]) if memory else None
    drawn = DrawnTimeline(
        tuple(tuple(rank) for rank in measured[index]), schedule.placement, curves,
        name=f"{schedule.name} (measured)", unit="s", memory_unit="bytes", pipelines=schedule.pipelines,
    )
    trace = trace_events(drawn, time_unit_us=1e6)
    trace["otherData"]["measured_steps"] = steps_json(steps)
    write_atomic(path, json_text(trace, separators=(",", ":")))
    return index + skip
