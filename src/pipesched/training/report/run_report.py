"""The report of a training run (:mod:`pipesched.render.run_report`): ``pipesched train --report
FILE.html`` from what rank 0 brought back (the metrics of every logging interval and, for a
pipeline, the measured timeline of the median step beside the simulator's replay of it), or
``pipesched report --run FILE.jsonl`` from a run's ``--metrics`` file (the curves only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from ...errors import ConfigError
from ...schedule import Schedule

NEEDED = ("step", "loss", "lr", "tokens_per_s", "step_time_s", "peak_memory_bytes")


def write_run_report(path: Path, schedule: Optional[Schedule], result) -> None:
    """Write the report of ``result`` (a TrainResult) to ``path`` (atomically)."""
    from ...outfiles import write_atomic
    from ...render.run_report import run_report_html

    title = schedule.describe() if schedule is not None else "reference (one process, no pipeline)"
    title += f", {result.dtype}" + (f", {result.dp} data-parallel replicas" if result.dp > 1 else "")
    timelines = comparison = None
    if schedule is not None and result.timelines:
        timelines, comparison = _step_timelines(schedule, result)
    write_atomic(path, run_report_html(title, result.loop.metrics, timelines, comparison))


def _step_timelines(schedule: Schedule, result):
    """(measured median step, simulated from the measured median costs) and a sentence on them."""
    from ...render.timeline import Timeline as Drawn
    from ...runtime.metering.timeline import (
        compare_to_simulation,
        median_costs,
        median_step,
        predicted_timeline,
    )

    steps = result.timelines[1:] or result.timelines  # the first step warms up
    measured = steps[median_step(steps)]
    simulated = predicted_timeline(schedule, median_costs(steps), result.comm_latency)
    c = compare_to_simulation(schedule, steps, result.comm_latency)

    def drawn(spans, what: str) -> Drawn:
        return Drawn(tuple(tuple(rank) for rank in spans), schedule.placement, name=f"{schedule.name} ({what})",
                     unit="s", pipelines=schedule.pipelines)

    sentence = (f"Measured: {1000 * c.measured_makespan:.2f} ms, bubble {100 * c.measured_bubble:.1f}%. "
                f"Simulated from the measured costs: {1000 * c.simulated_makespan:.2f} ms, "
                f"bubble {100 * c.simulated_bubble:.1f}% (measured/simulated {c.ratio:.3f}).")
    return (drawn(measured, "measured, median step"), drawn(simulated, "simulated")), sentence


def read_metrics(path: Path) -> list[dict]:
    """The logging intervals of a ``--metrics`` file (ConfigError, one line, for what is not one)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise ConfigError(f"--run {str(path)!r}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--run {str(path)!r}: not a text file") from None
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ConfigError(f"--run {str(path)!r}: line {number} is not JSON ({err.msg})") from None
        missing = [k for k in NEEDED if not isinstance(row, dict) or k not in row]
        if missing:
            raise ConfigError(f"--run {str(path)!r}: line {number} is not a metrics line of pipesched train "
                              f"(no {', '.join(missing)})")
        rows.append(row)
    if not rows:
        raise ConfigError(f"--run {str(path)!r}: no metrics lines (pipesched train --metrics writes them)")
    return rows


def write_file_report(path: Path, output: Path) -> None:
    """``pipesched report --run``: the report of the run whose ``--metrics`` file is ``path``."""
    from ...outfiles import write_atomic
    from ...render.run_report import run_report_html

    write_atomic(output, run_report_html(f"the run of {path}", read_metrics(path)))
