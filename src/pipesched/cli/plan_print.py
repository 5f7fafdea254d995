"""What the planning commands print for people: ``simulate``'s summary, ``compare``'s table,
and the line naming the stages a schedule recomputes (``export`` and ``simulate`` both say it).

Apart from :mod:`.plan` so that the commands read as their checks and calls, and so that
``pipesched demo`` prints its comparisons with the same table as ``compare``.
"""

from __future__ import annotations

import typer

from ..memory import format_bytes, schedule_recompute
from ..schedule import Schedule
from ..simulate import SimResult
from ..units import format_number
from . import options as opt
from .tables import Column, print_table


def say_recompute(schedule: Schedule, then: str, echo=lambda line: typer.echo(line, err=True)) -> None:
    """One line naming the stages the schedule recomputes and why (zb-auto's choice), if any;
    ``then`` may name ``{stages}``."""
    own = schedule_recompute(schedule)
    if own is None:
        return
    stored = schedule.meta.get("without_recompute", "missing")
    versus = ("" if stored == "missing" else "; nothing fits without recomputing" if stored is None
              else f"; the best order that fits without recomputing takes {stored:.4g}")
    echo(f"recompute: stages {own.spec()} ({schedule.meta.get('origin', '')}{versus}); "
         + then.format(stages=own.spec()))


def print_result(result: SimResult) -> None:
    """A short human summary of one simulation."""
    from ..render.console import output_console

    console = output_console()
    sched = result.schedule
    console.print(f"[bold]{sched.describe()}[/bold]")
    in_bytes = result.peak_memory_bytes is not None
    peak_bytes = f" ({format_bytes(max(result.peak_memory_bytes))})" if in_bytes else ""
    console.print(
        f"makespan {format_number(result.makespan)}  span {format_number(result.span)}  "
        f"bubble {100 * result.bubble_ratio:.1f}%  peak memory {format_number(result.max_peak_memory)}{peak_bytes}"
    )
    say_recompute(sched, "counted in the times and the memory above", console.print)
    if result.parameter_copies > 1:
        console.print(
            f"parameters: {result.parameter_copies}x a one-copy pipeline's per rank "
            "(peak memory counts activations only)"
        )
    columns = [Column("rank"), Column("actions"), Column("busy"), Column("idle"), Column("peak memory")]
    columns += [Column("peak bytes")] if in_bytes else []
    rows = [[str(r), str(len(result.timeline[r])), format_number(result.busy[r]),
             format_number(result.makespan - result.busy[r]), format_number(result.peak_memory[r]),
             *((format_bytes(result.peak_memory_bytes[r]),) if in_bytes else ())] for r in range(sched.ranks)]
    print_table(console, columns, rows)


def print_compare(s: opt.Setup, rows: list[dict]) -> None:
    """The compare table: one row per schedule, speed-up over 1f1b in the last column; the
    schedules that could not be built are named below it, with why."""
    from ..render.console import output_console

    c = s.costs
    title = (f"p={s.ranks} m={s.microbatches}  F,B,W={c.F:g},{c.B:g},{c.W:g} comm={c.comm:g}"
             + (f" stage overhead={c.stage_overhead:g}" if c.stage_overhead else "")
             + (f"  memory limit {s.memory_limit:g}" if s.memory_limit else ""))
    columns = [Column("schedule", justify="left", wrap=True), Column("chunks", short="v"), Column("makespan"),
               Column("span", drop=3), Column("bubble", drop=2), Column("peak memory (max)"),
               Column("per rank", justify="left", drop=4), Column("vs 1f1b", drop=1)]
    table, failed = [], []
    for row in rows:
        if "error" in row:
            failed.append(f"  {row['schedule']} (chunks={row['chunks']}): not built: {row['error']}")
            continue
        peaks = row["peak_memory"]
        per_rank = " ".join(f"{x:g}" for x in peaks) if len(peaks) <= 8 else f"{min(peaks):g}..{max(peaks):g}"
        mark = "" if row.get("fits", True) else " [red](over limit)[/red]"
        recomputed = row.get("recompute") or []
        table.append([
            row["schedule"] + (f" (recompute {','.join(map(str, recomputed))})" if recomputed else ""), str(row["chunks"]),
            format_number(row["makespan"]), format_number(row["span"]), f"{100 * row['bubble_ratio']:.1f}%",
            f"{max(peaks):g}{mark}", per_rank, f"{row.get('speedup_vs_1f1b', float('nan')):.3f}x",
        ])
    console = output_console()
    print_table(console, columns, table, title)
    for line in failed:
        console.print(line, style="red", highlight=False)
