"""Planning commands: ``list``, ``export``, ``simulate``, ``compare``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from ..jsontext import json_text
from ..compare import planned_work, simulate_all
from ..errors import ConfigError
from ..gather_placement import gathers_asked, planned_gathers
from ..memory import MemorySizes, StageMemory
from ..outfiles import check_output_path, write_atomic
from ..planning import actions_built
from ..registry import build_schedule, families, get_family
from ..schedule import Schedule
from ..schedule_files import check_format, csv_text, load_csv_file
from ..simulate import simulate
from . import app
from . import options as opt
from .activation_bytes import activation_share, measured_share
from .gather_flags import GatherLimit, GatherPlan, GatherTime
from .memory_limits import ActivationLimit
from .plan_print import print_compare, print_result, say_recompute
from .progress import planning_progress
from .tables import Column, print_table


@app.command("list")
def list_schedules() -> None:
    """Each schedule: when to use it, its chunks, placement and memory."""
    from ..render.console import output_console

    columns = [Column("name", justify="left"), Column("when to use it", justify="left", wrap=True),
               Column("chunks", justify="left", wrap=True), Column("placement", justify="left", drop=1),
               Column("backward", justify="left", wrap=True, drop=2), Column("peak memory", justify="left", wrap=True)]
    rows = [[f.name, f.summary, f.chunks_text(), f.placement, "split (I+W)" if f.split_backward else "full (B)", f.memory]
            for f in families()]
    print_table(output_console(), columns, rows, "pipesched schedules")


@app.command("export")
@opt.planning_options(without=("overlap",))  # the order of a CSV does not depend on it
def export(
    name: str = typer.Argument(..., help="Schedule name (pipesched list)."),
    plan: opt.PlanningFlags = opt.PlanningFlags(),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="CSV file (default: stdout)."),
    torchtitan: bool = typer.Option(
        False, "--torchtitan",
        help="Also print the torchtitan settings that run the CSV written to -o: 0.3.0's command-line "
        "flags (as comments) and 0.2's job-config TOML.",
    ),
    torchtitan_schedule: Optional[str] = typer.Option(
        None, "--torchtitan-schedule",
        help="With --torchtitan: the pipeline_parallel_schedule to name (default: the one whose stage "
        "layout is the CSV's); one that lays the stages out otherwise is refused.",
    ),
    microbatch_size: int = typer.Option(
        1, "--microbatch-size", help="With --torchtitan: samples per microbatch (local_batch_size = m x this)."
    ),
    csv_format: str = typer.Option(
        "compute_only", "--format",
        help="compute_only: the compute actions; compute_comms: each rank's program with its sends, receives and "
        "gradient reductions (torch's _load_csv(..., format=\"compute_comms\") runs it as written).",
    ),
    gather_plan: str = GatherPlan,
    gather_time: Optional[str] = GatherTime,
    gather_limit: Optional[int] = GatherLimit,
) -> None:
    """Write a schedule as a torch.distributed.pipelining CSV (compute-only, or with its communication)."""
    s = plan.setup()
    if torchtitan and output is None:
        raise ConfigError("--torchtitan needs -o FILE: the settings point torchtitan at that CSV")
    if torchtitan_schedule is not None and not torchtitan:
        raise ConfigError("--torchtitan-schedule goes with --torchtitan (it names the schedule in torchtitan's settings)")
    if microbatch_size < 1:
        raise ConfigError(f"--microbatch-size must be at least 1, got {microbatch_size}")
    if check_format(csv_format) != "compute_only" and torchtitan:
        raise ConfigError("--torchtitan needs --format compute_only: torchtitan loads a CSV in torch's default format")
    if output is not None:
        check_output_path(output, [".csv"])
    schedule = build_from_flags(name, s)
    settings = None
    if torchtitan:
        from ..interop.torchtitan import settings_toml

        settings = settings_toml(schedule, str(output), microbatch_size, torchtitan_schedule)  # refuses a layout torchtitan lacks
    programs = None
    if gathers_asked(gather_plan, gather_time, gather_limit):
        programs = _planned_gathers(schedule, s, csv_format, gather_plan, gather_time, gather_limit)
    text = csv_text(schedule, csv_format, programs)
    if output is None:
        typer.echo(text, nl=False)
        return
    write_atomic(output, text)
    typer.echo(f"wrote {output} ({schedule.describe()})", err=True)
    say_recompute(schedule, "the CSV does not carry it: train it with --recompute {stages}")
    if settings is not None:
        typer.echo(settings, nl=False)


def _planned_gathers(schedule: Schedule, s: opt.Setup, csv_format: str, plan: str, times: Optional[str],
                     limit: Optional[int]) -> tuple:
    """The programs ``export --gather-plan`` writes (each flag checked in one line)."""
    if csv_format != "compute_comms":
        raise ConfigError("--gather-plan, --gather-time and --gather-limit need --format compute_comms: "
                          "a compute_only CSV holds no gathers")
    return planned_gathers(schedule, s.costs, plan, times, limit)


def schedule_from_flags(name: Optional[str], csv: Optional[Path], s: opt.Setup) -> Schedule:
    """The schedule a command names: a registered one built for the flags, or a CSV file."""
    if (name is None) == (csv is None):
        raise ConfigError("give a schedule name or --csv FILE (one of the two)")
    if csv is not None:
        from ..validate import validate

        return validate(load_csv_file(csv))
    return build_from_flags(name, s)


def build_from_flags(name: str, s: opt.Setup) -> Schedule:
    """``build_schedule`` for the shared flags, with a word on the terminal if it takes a while."""
    family = get_family(name)
    with planning_progress(family.name, actions_built(family, s.ranks, s.microbatches, s.chunks, opt.recompute_limit(s))):
        return build_schedule(name, s.ranks, s.microbatches, s.chunks, s.costs, s.memory_limit, s.objective,
                              s.recompute_input)


@app.command("simulate")
@opt.planning_options(source=True)
def simulate_cmd(
    plan: opt.PlanningFlags = opt.PlanningFlags(),
    as_json: bool = typer.Option(False, "--json", help="Print the metrics as one JSON object."),
    draw: bool = typer.Option(False, "--draw", help="Also draw the timeline in the terminal."),
    activation_bytes: Optional[str] = typer.Option(
        None, "--activation-bytes",
        help="One microbatch's activations on a rank's share, e.g. 512MiB[,STASH[,INPUT]]: what F keeps, "
        "what I leaves for W (default: all of it), a stage's input (default 0). Adds peak bytes per rank.",
    ),
    recompute: Optional[str] = typer.Option(
        None, "--recompute", help="With --activation-bytes: the model's stages that recompute their activations (all, none, 0,2; dualpipe: in both copies)."
    ),
    activation_limit: Optional[str] = ActivationLimit,
) -> None:
    """Simulate one schedule: makespan, span, bubble ratio, busy time and peak memory per rank."""
    if draw and as_json:
        raise ConfigError("--draw prints a chart and --json prints data for programs: give one of them")
    share = activation_share(activation_bytes)
    if recompute is not None and not recompute.strip():
        raise ConfigError("--recompute is empty: give all, none or the model's stages such as 0,2")
    if share is None and recompute is not None:
        raise ConfigError("--recompute needs --activation-bytes (what a recomputed stage saves is in bytes)")
    s = plan.setup(bytes_per_mb=share[0] if share is not None else None,  # M_B: one microbatch on a rank's share
                   activation_limit=activation_limit)
    if share is not None and s.recompute_input is None and plan.name is not None and s.memory_limit is not None:
        s = replace(s, recompute_input=measured_share(share, s.chunks or get_family(plan.name).max_chunks or 1))
    schedule = schedule_from_flags(plan.name, plan.csv, s)
    sizes = None
    if share is not None:
        from ..memory import recompute_stages, schedule_recompute

        own = schedule_recompute(schedule)
        if recompute is None and own is not None:
            recompute = own.spec()  # zb-auto's choice, unless --recompute says otherwise
        per_rank = schedule.stages // schedule.ranks // schedule.pipelines  # stages in one share
        keep, stash, inp = share
        sizes = MemorySizes((StageMemory(keep / per_rank, stash / per_rank),) * schedule.stages,
                            (inp,) * schedule.stages, recompute_stages(recompute, schedule))
    result = simulate(schedule, s.costs, sizes)
    if as_json:
        typer.echo(json_text(result.metrics()))
        return
    print_result(result)
    if draw:
        from ..render.terminal import print_timeline

        print_timeline(result)


def compare_rows(setup: opt.Setup) -> list[dict]:
    """Simulate every family for one configuration; failures become rows with a reason."""
    with planning_progress("every schedule", planned_work(setup.ranks, setup.microbatches, setup.chunks,
                                                          opt.recompute_limit(setup))):
        outcomes = simulate_all(
            setup.ranks, setup.microbatches, setup.chunks, setup.costs, setup.memory_limit, setup.objective,
            setup.recompute_input,
        )
    return [o.row() for o in outcomes]


@app.command("compare")
@opt.planning_options()
def compare(
    plan: opt.PlanningFlags = opt.PlanningFlags(),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as a JSON list."),
) -> None:
    """Every schedule for one configuration, side by side."""
    s = plan.setup()
    rows = compare_rows(s)
    if as_json:
        typer.echo(json_text(rows))
        return
    print_compare(s, rows)
