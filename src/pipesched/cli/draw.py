"""Drawing commands: ``draw`` (SVG, PNG or Perfetto trace of one schedule) and ``report`` (HTML)."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from ..compare import planned_work, simulate_all
from ..outfiles import check_output_path, write_atomic
from ..simulate import simulate
from . import app
from . import options as opt
from .plan import schedule_from_flags
from .progress import planning_progress

if TYPE_CHECKING:
    from ..render.html import Section

DRAW_SUFFIXES = (".svg", ".png", ".json")


@app.command("draw")
@opt.planning_options(source=True)
def draw(
    plan: opt.PlanningFlags = opt.PlanningFlags(),
    output: Path = typer.Option(..., "--output", "-o", help="chart.svg, chart.png (needs Pillow) or trace.json (Perfetto)."),
) -> None:
    """Draw one schedule's simulated timeline: Gantt chart (SVG/PNG) or Perfetto trace (JSON)."""
    check_output_path(output, DRAW_SUFFIXES)
    s = plan.setup()
    schedule = schedule_from_flags(plan.name, plan.csv, s)
    result = simulate(schedule, s.costs)
    suffix = output.suffix.lower()
    if suffix == ".svg":
        from ..render.svg import gantt_svg

        data: str | bytes = gantt_svg(result)
    elif suffix == ".png":
        from ..render.png import gantt_png

        data = gantt_png(result)
    else:
        from ..render.trace import trace_json

        data = trace_json(result)
    write_atomic(output, data)
    typer.echo(f"wrote {output} ({schedule.describe()})", err=True)


@app.command("report")
@opt.planning_options()
def report(
    plan: opt.PlanningFlags = opt.PlanningFlags(),
    output: Path = typer.Option(Path("report.html"), "--output", "-o", help="The HTML file to write."),
    run: Optional[Path] = typer.Option(
        None, "--run", help="Instead: the report of a training run, from its pipesched train --metrics FILE.jsonl "
        "(docs/training.md)."),
) -> None:
    """Every schedule for one configuration in one offline HTML page: charts, metrics, when to choose each."""
    check_output_path(output, [".html", ".htm"])
    if run is not None:
        from ..training.report.run_report import write_file_report

        write_file_report(run, output)
        typer.echo(f"wrote {output} (the run of {run})", err=True)
        return
    s = plan.setup()
    write_report(s, output)


def write_report(s: opt.Setup, output: Path) -> None:
    """Simulate every schedule for ``s`` and write the HTML report to ``output``."""
    from ..render.html import report_html

    with planning_progress("every schedule", planned_work(s.ranks, s.microbatches, s.chunks, opt.recompute_limit(s))):
        outcomes = simulate_all(s.ranks, s.microbatches, s.chunks, s.costs, s.memory_limit, s.objective,
                                s.recompute_input)
    write_atomic(output, report_html(outcomes, config_line(s), [advice_section(s)]))
    drawn = sum(1 for o in outcomes if o.result is not None)
    typer.echo(f"wrote {output} ({drawn} schedules, p={s.ranks} m={s.microbatches})", err=True)


def config_line(s: opt.Setup) -> str:
    """The configuration in one line, as the report's subtitle."""
    c = s.costs
    text = f"p={s.ranks}, m={s.microbatches}, costs F,B,W={c.F:g},{c.B:g},{c.W:g}, comm={c.comm:g}"
    text += f", stage overhead={c.stage_overhead:g}" if c.stage_overhead else ""
    if s.chunks is not None:
        text += f", chunks={s.chunks} where a schedule accepts it"
    if c.stage_multipliers:
        text += ", stage multipliers " + ",".join(f"{x:g}" for x in c.stage_multipliers)
    if s.memory_limit is not None:
        text += f", memory limit {s.memory_limit:g}"
    if s.objective is not None:
        text += f", objective {s.objective}"
    return text


def advice_section(s: opt.Setup) -> "Section":
    """The advisor's recommendation and ranked table for the report's configuration."""
    from ..advise import advise
    from ..advise.html import advice_html
    from ..errors import PipeschedError
    from ..render.html import Section

    # without a limit the fastest schedule is often a memory-hungry one; advise within 1F1B's
    # memory (p), the budget most users already run with, and say so
    limit = s.memory_limit if s.memory_limit is not None else float(s.ranks)
    intro = "" if s.memory_limit is not None else (
        f"<p>No memory limit was given: advice within 1F1B's memory, {s.ranks} M_B per rank "
        "(pass --memory-limit to change it).</p>"
    )
    try:
        advice = advise(s.ranks, limit, microbatches=s.microbatches, costs=s.costs, objective=s.objective or "makespan")
        body = intro + advice_html(advice, top=3)
    except PipeschedError as err:
        body = f"<p>{escape(str(err))}</p>"
    return Section("Which schedule to choose (pipesched advise)", body)
