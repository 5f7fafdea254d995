"""``pipesched advise --gpus G``: how to split G GPUs into pipeline stages x data-parallel replicas."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from ..jsontext import json_text
from ..advise.estimate import TransformerCosts
from ..advise.howto import guidance
from ..advise.fabric import Fabric, Link
from ..advise.layout import DEFAULT_DP_LATENCY_MS, LayoutAdvice, advise_layouts
from ..advise.layout_chart import whole_layout_timeline
from ..advise.layout_costs import LayoutCosts, check_ep
from ..advise.layout_explain import dimension_lines, layout_name, run_lines, runner_lines
from ..advise.layout_search import advise_whole_layouts, flag_of
from ..parallel_layout import ParallelLayout
from ..advise.result import Candidate
from ..errors import ConfigError
from ..outfiles import check_output_path, write_atomic
from ..advise.explain import WHOLE_DEVICE
from ..units import format_time
from .option_group import option_group
from .tables import Column, fitted_table

if TYPE_CHECKING:  # rich loads when the layouts are printed
    from rich.table import Table

    from ..render.timeline import Timeline

@dataclass(frozen=True)
class LayoutFlags:
    """``--gpus`` and the layout's flags, as typed (None: not given)."""

    gpus: Optional[int]
    dp_bandwidth: Optional[float]
    dp_latency: Optional[float]
    report: Optional[Path]
    gpus_per_node: Optional[int]
    node_bandwidth: Optional[float]
    tp: Optional[int]
    dp_shard: Optional[int]
    dp: Optional[int]
    ep: Optional[int]

    @property
    def latency(self) -> float:
        """The replicas' all-reduce latency per bucket, in ms (its default where not given)."""
        return DEFAULT_DP_LATENCY_MS if self.dp_latency is None else self.dp_latency

    def fixed(self) -> dict[str, int]:
        """The layout's dimensions given (``tp``, ``dp_shard``, ``dp_replicate``), which the search keeps."""
        return {k: v for k, v in (("tp", self.tp), ("dp_shard", self.dp_shard), ("dp_replicate", self.dp))
                if v is not None}


LAYOUT_OPTIONS: tuple[tuple[str, object, object], ...] = (
    ("gpus", Optional[int], typer.Option(
        None, "--gpus",
        help="GPUs in all: search pipeline ranks x data-parallel replicas (needs a model description and --global-batch).")),
    ("dp_bandwidth", Optional[float], typer.Option(
        None, "--dp-bandwidth", help="With --gpus: GB/s between data-parallel replicas (default --bandwidth).")),
    ("dp_latency", Optional[float], typer.Option(
        None, "--dp-latency", help=f"With --gpus: ms per all-reduce bucket (default {DEFAULT_DP_LATENCY_MS:g}).")),
    ("report", Optional[Path], typer.Option(
        None, "--report", help="With --gpus: write an HTML report of the chosen layout.")),
    ("gpus_per_node", Optional[int], typer.Option(
        None, "--gpus-per-node",
        help="With --gpus: GPUs per node; searches whole layouts, pp x dp x dp_shard x tp (docs/layouts.md).")),
    ("node_bandwidth", Optional[float], typer.Option(
        None, "--node-bandwidth", help="With --gpus-per-node: GB/s per GPU between nodes (--bandwidth: within one).")),
    ("tp", Optional[int], typer.Option(None, "--tp", help="With --gpus: fix tensor parallelism (ranks splitting each layer).")),
    ("dp_shard", Optional[int], typer.Option(None, "--dp-shard", help="With --gpus: fix FSDP shards inside a stage.")),
    ("dp", Optional[int], typer.Option(None, "--dp", help="With --gpus and --gpus-per-node: fix whole replicas of the pipeline.")),
    ("ep", Optional[int], typer.Option(
        None, "--ep", help="With --gpus-per-node and --experts: routed experts split over this many data-parallel ranks "
        "(default: every size dividing the experts and the data-parallel ranks is searched).")),
)


def layout_options(command):
    """Give ``pipesched advise`` the layout's flags in place of its ``layout: LayoutFlags``."""
    return option_group("layout", LayoutFlags, LAYOUT_OPTIONS)(command)


WITHIN_LATENCY_MS, ACROSS_LATENCY_MS = 0.005, 0.02  # per ring step: NVLink's and InfiniBand's order of magnitude


def run(gpus: Optional[int], global_batch: Optional[int], model: TransformerCosts, dp_bandwidth: Optional[float],
        dp_latency: float, report: Optional[Path], as_json: bool, top: int, **options) -> None:
    """Search the layouts, then print the table (or JSON) and write the report."""
    if gpus is None:
        raise ConfigError("--report belongs to --gpus G: give the number of GPUs to split")
    if global_batch is None:
        raise ConfigError("--gpus needs --global-batch G (samples per step over every replica)")
    if report is not None:
        check_output_path(report, [".html", ".htm"])
    advice = advise_layouts(gpus, model, global_batch, dp_bandwidth=dp_bandwidth, dp_latency_ms=dp_latency, **options)
    if report is not None:
        write_atomic(report, layout_report(advice))
        typer.echo(f"wrote {report}", err=True)
    if as_json:
        typer.echo(json_text(advice.to_json()))
        return
    from ..render.console import output_console

    console = output_console()
    console.print(f"[bold]pipesched advise[/bold]  {gpus} GPUs, global batch {global_batch}")
    console.print(layout_table(advice, top, console.width), crop=False, soft_wrap=False)  # uncut, even on a narrow console
    console.print("Layouts searched: " + "; ".join(advice.searched_lines()), highlight=False)
    best = advice.recommended
    console.print(f"[bold green]Recommendation:[/bold green] {recommendation(advice)}")
    for line in advice.skipped:
        console.print(f"  - skipped {line}")
    for line in split_lines(best.candidate, model):
        console.print(line, highlight=False)
    for line in guidance(best.candidate, best.pp, best.dp):
        console.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)  # commands and code: copied whole, never folded


def run_whole(gpus: int, global_batch: Optional[int], model: TransformerCosts, gpus_per_node: Optional[int],
              node_bandwidth: Optional[float], fixed: dict, dp_latency: float, report: Optional[Path], as_json: bool,
              top: int, ep: Optional[int] = None, **options) -> None:
    """``advise --gpus G --gpus-per-node N``: search whole layouts, print the table (or JSON) and why
    (``ep``: expert parallelism, given; None: searched)."""
    if gpus_per_node is None:
        given = [flag_of(k) for k in fixed] + (["--ep"] if ep is not None else [])
        raise ConfigError(f"{', '.join(given)} with --gpus needs --gpus-per-node "
                          "(which ranks share a node decides each dimension's links)")
    if global_batch is None:
        raise ConfigError("--gpus needs --global-batch G (samples per step over every replica)")
    if ep is not None:
        check_ep(model.spec, ep)  # before any layout: every one would refuse it alike
    if model.hardware.bandwidth is None or node_bandwidth is None:
        raise ConfigError("--gpus-per-node needs --bandwidth (GB/s within a node) and --node-bandwidth (GB/s per GPU between nodes)")
    fabric = Fabric(gpus_per_node, Link.from_gbps(model.hardware.bandwidth, WITHIN_LATENCY_MS),
                    Link.from_gbps(node_bandwidth, ACROSS_LATENCY_MS))
    if report is not None:
        check_output_path(report, [".html", ".htm"])
    advice = advise_whole_layouts(gpus, model, global_batch, fabric, fixed=fixed, replica_latency=dp_latency,
                                  ep=ep, **options)
    if report is not None:
        chart = whole_layout_timeline(advice.recommended, model, fabric, dp_latency)
        write_atomic(report, layout_report(advice, top, chart))
        typer.echo(f"wrote {report}", err=True)
    if as_json:
        typer.echo(json_text(advice.to_json()))
        return
    from ..render.console import output_console

    console = output_console()
    best = advice.recommended
    console.print(f"[bold]pipesched advise[/bold]  {gpus} GPUs in nodes of {gpus_per_node}, global batch {global_batch}")
    console.print(whole_table(advice, top, console.width), crop=False, soft_wrap=False)
    console.print(f"[bold green]Recommendation:[/bold green] {layout_name(best)} with {best.candidate.label()}", highlight=False)
    costs = LayoutCosts.for_layout(model, ParallelLayout(best.pp, best.dp, best.dp_shard, best.tp), fabric, ep=best.ep)
    tokens = global_batch * model.spec.seq_len
    for line in dimension_lines(best, costs, tokens, gpus) + runner_lines(advice):
        console.print(f"  {line}", highlight=False)
    for line in split_lines(best.candidate, model) + [f"  {line}" for line in run_lines(best)]:
        console.print(line, highlight=False, markup=False, soft_wrap=True)  # commands: copied whole, never folded
    console.print(f"Layouts searched ({len(advice.searched)}): " + "; ".join(advice.searched), highlight=False)
    console.print(f"Layouts left out ({len(advice.skipped)}): " + "; ".join(advice.skipped), highlight=False)


def whole_table(advice: LayoutAdvice, top: int, width: int) -> Table:
    """The ranked whole layouts, fitted to ``width`` columns (times in ms, with units)."""
    columns = [Column("#"), Column("pp"), Column("dp"), Column("dp_shard", short="fsdp"), Column("tp"),
               Column("schedule", justify="left", wrap=True), Column("chunks", short="v"), Column("m"), Column("step"),
               Column("gather (exposed)", drop=2), Column("reduce (exposed)", drop=1), Column(f"GB {WHOLE_DEVICE}")]
    rows = []
    for i, c in enumerate(_rows(advice, top)):
        gb = f"{c.candidate.memory_gb:.1f}" if c.candidate.memory_gb is not None else "-"
        name = c.candidate.schedule + (" +recompute" if c.candidate.recompute != "none" else "")
        rows.append([str(i + 1), str(c.pp), str(c.dp), str(c.dp_shard), str(c.tp), name, str(c.candidate.chunks),
                     str(c.candidate.microbatches), format_time(c.step_time, "ms"),
                     f"{format_time(c.gather_per_rank, 'ms')} ({format_time(c.exposed_gather, 'ms')})",
                     f"{format_time(c.allreduce_per_rank, 'ms')} ({format_time(c.exposed_allreduce, 'ms')})", gb])
    title = f"{len(advice.candidates)} layout candidates; best {min(top, len(advice.candidates))} shown"
    return fitted_table(columns, rows, width, title, f"GB {WHOLE_DEVICE}: weights, gradients, optimizer state, "
                        "gathered window, unsharded gradients and activations", ["bold green"] + [None] * (len(rows) - 1))


def split_lines(c: Candidate, model: Optional[TransformerCosts]) -> list[str]:
    """The candidate's layers per stage (and how a rank's layers went to its stages, when the
    advisor chose), and the same split as ``train --stage-blocks`` for a model whose embedding
    and head are blocks of their own, as the runtime's ``gpt`` is."""
    if not c.layers_per_stage:
        return []
    how = f", {c.layer_assignment}" if c.layer_assignment else ""
    lines = [f"  Layers per stage (model order{how}): {', '.join(map(str, c.layers_per_stage))}"]
    if model is not None and model.spec.vocab:
        blocks = list(c.layers_per_stage)
        blocks[0] += 1  # the embedding
        blocks[-1] += 1  # the head
        lines.append(f"  Blocks per stage with the embedding and the head one block each (COUNTS below, "
                     f"or train --stage-blocks): {','.join(map(str, blocks))}")
    return lines


def recommendation(advice: LayoutAdvice) -> str:
    best = advice.recommended
    c = best.candidate
    text = (f"{best.pp} pipeline ranks x {best.dp} replicas with {c.schedule} (chunks={c.chunks}, m={c.microbatches} "
            f"per replica): {format_time(best.step_time, 'ms')} per step, {format_time(best.exposed_allreduce, 'ms')} of it all-reduce not hidden")
    base = advice.baseline(best.pp, best.dp)
    if base is not None and base is not best:
        text += f"; {base.step_time / best.step_time:.3f}x faster than 1f1b on the same layout"
    return text


def _rows(advice: LayoutAdvice, top: int) -> list:
    return list(advice.candidates[:max(1, top)])


def layout_table(advice: LayoutAdvice, top: int, width: int) -> Table:
    """The ranked layouts, fitted to ``width`` columns (times in ms, with units)."""
    columns = [Column("#"), Column("pp"), Column("dp"), Column("schedule", justify="left", wrap=True), Column("chunks", short="v"),
               Column("m"), Column("step"), Column("all-reduce (exposed)", drop=1), Column(f"GB {WHOLE_DEVICE}")]
    rows = []
    for i, c in enumerate(_rows(advice, top)):
        gb = f"{c.candidate.memory_gb:.1f}" if c.candidate.memory_gb is not None else "-"
        rows.append([str(i + 1), str(c.pp), str(c.dp), c.candidate.schedule, str(c.candidate.chunks),
                     str(c.candidate.microbatches), format_time(c.step_time, "ms"),
                     f"{format_time(c.allreduce_per_rank, 'ms')} ({format_time(c.exposed_allreduce, 'ms')})", gb])
    title = f"{len(advice.candidates)} layout candidates; best {min(top, len(advice.candidates))} shown"
    return fitted_table(columns, rows, width, title, f"GB {WHOLE_DEVICE}: weights, gradients, optimizer state and activations",
                        ["bold green"] + [None] * (len(rows) - 1))


def layout_report(advice: LayoutAdvice, top: int = 12, timeline: Optional["Timeline"] = None) -> str:
    """The chosen layout, why, and the ranked layouts, with the chosen schedule's chart
    (``timeline``: a whole layout's, with its comm lane)."""
    from ..registry import build_schedule, get_family
    from ..advise.search import objective_option
    from ..render.svg import gantt_svg
    from ..render.html import CSS
    from ..simulate import simulate

    best = advice.recommended
    c = best.candidate
    schedule = build_schedule(c.schedule, best.pp, c.microbatches, c.chunks, c.costs, c.memory_limit,
                              **objective_option(get_family(c.schedule), c.objective or "makespan"))
    rows = ["<table><tr><th>pp x dp</th><th>schedule</th><th>chunks</th><th>m</th><th>step ms</th>"
            "<th>all-reduce ms (exposed)</th><th>memory GB</th></tr>"]
    for row in _rows(advice, top):
        cls = ' class="best"' if row is best else ""
        gb = f"{row.candidate.memory_gb:.3g}" if row.candidate.memory_gb is not None else "\u2013"
        rows.append(f"<tr><td{cls}>{row.pp} \u00d7 {row.dp}</td><td>{escape(row.candidate.schedule)}</td>"
                    f"<td>{row.candidate.chunks}</td><td>{row.candidate.microbatches}</td><td{cls}>{row.step_time:.4g}</td>"
                    f"<td>{row.allreduce_per_rank:.3g} ({row.exposed_allreduce:.3g})</td><td>{gb}</td></tr>")
    rows.append("</table>")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>pipesched layout: {advice.gpus} GPUs</title><style>{CSS}</style></head><body>",
        f"<h1>Layout for {advice.gpus} GPUs: {best.pp} pipeline ranks \u00d7 {best.dp} data-parallel replicas"
        + (f" \u00d7 {best.dp_shard} FSDP shards \u00d7 tp {best.tp}" if timeline is not None else "") + "</h1>",
        f'<p class="config">Global batch {advice.global_batch}; each replica runs its pipeline on '
        f"{advice.global_batch // best.dp} samples; times in ms.</p>",
        f"<p><strong>Recommendation:</strong> {escape(recommendation(advice))}</p>",
        "\n".join(rows),
        f"<h2>{escape(schedule.describe())}, one replica</h2>",
        f'<div class="chart">{gantt_svg(timeline or simulate(schedule, c.costs))}</div>',
        "</body></html>",
    ])
