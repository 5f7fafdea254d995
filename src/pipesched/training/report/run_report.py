"""The report of a training run (:mod:`pipesched.render.run_report`): ``pipesched train --report
FILE.html`` from the run's logging intervals (its ``--metrics`` file where it has one, so that a
resumed run's report covers the whole run) and, for a pipeline, one measured step drawn above
the simulator's replay of it; or ``pipesched report --run FILE.jsonl`` from a run's ``--metrics``
file (the curves only).

The bubble the page states, in its table, its text and its charts' titles, is one figure: the
median logging interval's (:func:`pipesched.render.run_figures.bubble_interval`). The step drawn
is that interval's (with ``--log-every 1``, the interval is the step), the simulated one the
simulator's run of the same schedule under the costs that interval was simulated with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from ...execution import Span
from ...render.run_figures import bubble_interval, layout_text
from ...schedule import Schedule
from .metrics_file import read_metrics


def run_rows(result, metrics_path: Optional[str]) -> list[dict]:
    """The run's logging intervals: its ``--metrics`` file's (the whole run, resumes included)
    where it wrote one (and it reads back), else those of this launch."""
    from ...errors import ConfigError

    if metrics_path is not None:
        try:
            return read_metrics(Path(metrics_path), "--metrics", cut_short=True)
        except ConfigError:  # changed under the run: this launch's own intervals
            pass
    return list(result.loop.metrics) if result is not None and result.loop else []


def run_title(schedule: Optional[Schedule], layout=None, dtype: Optional[str] = None) -> str:
    """The run in one line: its schedule, its layout (a ParallelLayout), its precision."""
    title = schedule.describe() if schedule is not None else "reference (one process, no pipeline)"
    if schedule is not None and layout is not None:
        title += f", {layout_text(layout.pp, layout.dp_replicate, layout.dp_shard, layout.tp)}"
    return title + (f", {dtype}" if dtype else "")


def write_run_report(path: Path, schedule: Optional[Schedule], result, rows: Sequence[dict], layout=None) -> None:
    """Write the report of the run whose intervals are ``rows`` to ``path`` (atomically):
    ``result``, this launch's TrainResult, or None when the run stopped (``layout``: its layout)."""
    from ...outfiles import write_atomic
    from ...render.run_report import run_report_html

    timelines = comparison = None
    if schedule is not None and result is not None and result.timelines:
        timelines, comparison = _step_timelines(schedule, result, rows)
    title = run_title(schedule, result.layout, result.dtype) if result is not None else run_title(schedule, layout)
    write_atomic(path, run_report_html(title, rows, timelines, comparison))


def _step_timelines(schedule: Schedule, result, rows: Sequence[dict]):
    """(the measured step drawn, the simulator's run of it) and a sentence on them."""
    from ...render.timeline import Timeline as Drawn
    from ...runtime.metering.bubble_share import measured_bubble
    from ...runtime.metering.timeline import makespan, median_costs, predicted_timeline
    from ...simulate import simulate
    from ...costs import Costs

    interval = bubble_interval(rows)
    index = _drawn_step(result, rows, interval, measured_bubble)
    measured = result.timelines[index]
    step = result.first_step + index + 1
    if interval is not None and "simulated_costs_ms" in interval:
        sim = simulate(schedule, Costs(**interval["simulated_costs_ms"]))
        simulated = [[Span(s.action, s.start / 1000, s.end / 1000) for s in rank] for rank in sim.timeline]
        said = (f"Bubble of the median logging interval (step {interval['step']}): measured "
                f"{100 * interval['bubble_share']:.1f}%, simulated from its measured costs "
                f"{100 * interval['simulated_bubble_share']:.1f}%. ")
    else:  # the interval's costs are not known: the step replayed with the run's median costs
        simulated = predicted_timeline(schedule, median_costs(result.timelines[1:] or result.timelines),
                                       result.comm_latency)
        said = ""
    said += (f"Drawn: step {step}, measured bubble {100 * measured_bubble([measured]):.1f}%, "
             f"{1000 * makespan(measured):.2f} ms; simulated {1000 * makespan(simulated):.2f} ms "
             f"(measured/simulated {makespan(measured) / makespan(simulated):.3f}).")

    def drawn(spans, what: str) -> Drawn:
        return Drawn(tuple(tuple(rank) for rank in spans), schedule.placement, name=f"{schedule.name} ({what})",
                     unit="s", pipelines=schedule.pipelines)

    return (drawn(measured, f"measured, step {step}"), drawn(simulated, "simulated")), said


def _drawn_step(result, rows: Sequence[dict], interval: Optional[dict], measured_bubble) -> int:
    """The index in ``result.timelines`` of the step to draw: of the steps of ``interval`` this
    launch ran (all its steps after the first where it ran none of them: a resumed run's median
    interval may be the interrupted run's), the one whose own bubble is the lower median."""
    first = result.first_step
    indices = range(len(result.timelines))
    if interval is not None:
        before = max((r["step"] for r in rows if r["step"] < interval["step"]), default=0)
        indices = [i for i in indices if before < first + i + 1 <= interval["step"]]
    if interval is None or not indices:
        indices = list(range(len(result.timelines)))[1:] or [0]
    steps = sorted((i for i in indices if result.timelines[i] and all(result.timelines[i])),
                   key=lambda i: measured_bubble([result.timelines[i]]))
    return steps[(len(steps) - 1) // 2] if steps else indices[0]


def write_file_report(path: Path, output: Path) -> None:
    """``pipesched report --run``: the report of the run whose ``--metrics`` file is ``path``."""
    from ...outfiles import write_atomic
    from ...render.run_report import run_report_html

    write_atomic(output, run_report_html(f"the run of {path}", read_metrics(path)))
