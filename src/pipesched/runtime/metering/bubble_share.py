"""The bubble share of some steps of a pipeline (a logging interval's), measured from the runtime's
action spans, beside the share the simulator gives the same schedule under costs measured from
the same spans.

- measured (:func:`idle_shares`): per rank, the share of each step's makespan (from the step's
  synchronised start to the last action's end on any rank of the pipeline) in which that rank ran
  no action, averaged over the steps; the mean over ranks is :func:`.timeline.bubble`'s figure.
  The optimizer step and the gradient reduction after the last action are not in the makespan,
  nor in the simulator's.
- simulated (:func:`simulated_bubble`): ``simulate(schedule, costs).bubble_ratio`` with
  :func:`interval_costs`: the mean measured duration of every (stage, kind) over the steps, as a
  rank's share (times the rank's stages over the model copies), averaged over the stages into
  ``F``, ``B`` (from ``I``), ``W`` and ``full_backward`` (from ``B``) after dividing each stage's
  by its stage multiplier: the stage's forward and whole backward over the stages' mean (as a
  profile derives them: :mod:`pipesched.training.profile`), and the
  one-way p2p latency measured before the run as ``comm``. So the simulator replays the same
  schedule with the actions' measured durations (up to the spread between a stage's kinds) and
  none of the time the runtime spends between them: the gap between the two figures is that time.

Pure Python: no torch.
"""

from __future__ import annotations

import statistics
from typing import Sequence

from ...costs import COST_RANGE, Costs
from ...ops import Op
from ...placement import stages_by_rank
from ...schedule import Schedule
from ...simulate import simulate
from .timeline import Timeline, makespan, mean_costs

MS = 1000.0  # the costs are in milliseconds: a microsecond action stays inside Costs' range


def idle_shares(steps: Sequence[Timeline]) -> list[float]:
    """Per rank, the mean over ``steps`` of ``1 - busy / makespan`` (see the module's docstring)."""
    ranks = len(steps[0])
    shares = [[1.0 - sum(s.end - s.start for s in t[r]) / makespan(t) for t in steps] for r in range(ranks)]
    return [statistics.fmean(share) for share in shares]


def measured_bubble(steps: Sequence[Timeline]) -> float:
    """The measured bubble share of ``steps``: the mean over ranks of :func:`idle_shares`. The
    one definition every output of a run shows (metrics, terminal, report's table, text and chart)."""
    return statistics.fmean(idle_shares(steps))


def interval_costs(schedule: Schedule, steps: Sequence[Timeline], comm: float,
                   recomputed: frozenset = frozenset()) -> Costs:
    """The costs, in milliseconds, the simulator replays ``steps`` of ``schedule`` with (see the
    module's docstring); ``comm``: the p2p latency in seconds. A stage the runtime recomputed
    (``recomputed``) reran its forward inside its ``I`` or ``B``: taken out, as the simulator adds
    it back for the stages the schedule carries as recomputed (zb-auto's choice, which the
    runtime recomputes). A busy host can time a stage's ``F`` above its recomputing backward: that
    backward is then taken as nothing and the costs held at their floor, so the figures stay a
    simulation's (never an invalid cost that stops the run)."""
    measured = mean_costs(steps)
    placement, copies = schedule.placement, schedule.pipelines
    held = [max(1, len(s)) for s in stages_by_rank(placement, schedule.ranks)]
    length = len(placement) // copies
    shares: list[dict[Op, list[float]]] = [{} for _ in range(length)]
    for (stage, kind), seconds in measured.items():
        if stage in recomputed and kind.is_backward:
            seconds = max(seconds - measured[(stage, Op.F)], 0.0)
        shares[stage % length].setdefault(kind, []).append(MS * seconds * held[placement[stage]] / copies)
    per_stage = [{kind: statistics.fmean(v) for kind, v in stage.items()} for stage in shares]
    totals = [stage[Op.F] + statistics.fmean(_backwards(stage)) for stage in per_stage]
    factors = [t / statistics.fmean(totals) for t in totals]

    def mean(kind: Op) -> float:  # over the stages that ran it, each divided by its stage's factor
        values = [stage[kind] / f for stage, f in zip(per_stage, factors) if kind in stage]
        return statistics.fmean(values) if values else 0.0

    full, split = mean(Op.B), any(Op.I in stage for stage in per_stage)
    backward, weight = (mean(Op.I), mean(Op.W)) if split else (full / 2, full / 2)
    return Costs(F=mean(Op.F), B=max(backward, COST_RANGE[0]), W=max(weight, COST_RANGE[0]), comm=MS * comm,
                 stage_multipliers=tuple(factors), full_backward=max(full, COST_RANGE[0]) if full else None)


def _backwards(stage: dict) -> list[float]:
    """What a stage's whole backward costs: its ``B``, its ``I + W``, or both (DualPipe runs each)."""
    whole = [stage[Op.B]] if Op.B in stage else []
    return whole + [stage[Op.I] + stage[Op.W]] if Op.I in stage else whole


def simulated_bubble(schedule: Schedule, costs: Costs) -> float:
    """The simulator's bubble share of ``schedule`` under ``costs``."""
    return simulate(schedule, costs).bubble_ratio


def bubble_figures(schedule: Schedule, steps: Sequence[Timeline], comm: float, recomputed: frozenset = frozenset()) -> dict:
    """A logging interval's fields: the measured bubble share (mean over ranks, and per rank),
    the simulated one and the costs it was simulated with (milliseconds)."""
    costs = interval_costs(schedule, steps, comm, recomputed)
    return {"bubble_share": measured_bubble(steps), "bubble_share_per_rank": idle_shares(steps),
            "simulated_bubble_share": simulated_bubble(schedule, costs),
            "simulated_costs_ms": {"F": costs.F, "B": costs.B, "W": costs.W, "full_backward": costs.full_backward,
                                   "comm": costs.comm, "stage_multipliers": list(costs.stage_multipliers)}}
