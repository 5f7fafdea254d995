"""The report of a training run: one self-contained offline HTML page, in the schedule report's
style (:mod:`.html`: its CSS, inline SVG, no script, nothing fetched).

A summary table, then the curves of the run's logging intervals (:mod:`pipesched.training.metrics`):
training loss with the held-out loss, the learning rate, tokens per second, peak memory per
rank, the bubble share measured and simulated (pipelines); for a pipeline, one measured step
above the simulator's timeline of the same schedule, on one time axis. The table's median step
and bubble are the run's figures (:mod:`.run_figures`), which the terminal and ``--summary`` show.
"""

from __future__ import annotations

import statistics
from html import escape
from typing import Optional, Sequence

from .html import CSS
from .layout import Scale
from .line_chart import Series, line_chart_svg
from .palette import BASE, box_colour
from .run_figures import bubble_interval, median_step_s
from .svg import gantt_svg
from .timeline import Timeline

TRAIN, EVAL, OTHER = BASE["F"], BASE["B"], BASE["W"]
STEP_WIDTH = 900  # px of the time axis of one step


def run_report_html(title: str, rows: Sequence[dict], timelines: Optional[tuple[Timeline, Timeline]] = None,
                    comparison: Optional[str] = None) -> str:
    """The page for a run's metrics ``rows``; ``timelines``: (measured, simulated) of one step;
    ``comparison``: a sentence on them (the run's bubble, the step drawn)."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>pipesched run: {escape(title)}</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>Training run</h1>",
        f'<p class="config">{escape(title)}</p>',
        _summary_table(rows),
        '<h2>Loss</h2><div class="chart">' + line_chart_svg("loss per logging interval", [
            Series("train", _points(rows, "step", "loss"), TRAIN),
            Series("eval", _points(rows, "eval_step", "eval_loss"), EVAL),
        ]) + "</div>",
        '<h2>Learning rate</h2><div class="chart">' + line_chart_svg(
            "learning rate of the interval's last step", [Series("lr", _points(rows, "step", "lr"), OTHER)]
        ) + "</div>",
        '<h2>Throughput</h2><div class="chart">' + line_chart_svg(
            "tokens per second (all devices)", [Series("tokens/s", _points(rows, "step", "tokens_per_s"), TRAIN)]
        ) + "</div>",
        '<h2>Memory</h2><div class="chart">' + line_chart_svg("peak memory per rank", _memory_series(rows), " GiB") + "</div>",
    ]
    if any("bubble_share" in r for r in rows):
        parts.append('<h2>Bubble</h2><div class="chart">' + line_chart_svg(
            "idle share of the step, measured and simulated (pipelines)", [
                Series("measured", _points(rows, "step", "bubble_share"), TRAIN),
                Series("simulated", _points(rows, "step", "simulated_bubble_share"), EVAL),
            ]) + "</div>")
    if timelines is not None:
        measured, simulated = timelines
        end = max(_end(measured), _end(simulated))
        scale = Scale(STEP_WIDTH / end, end)  # seconds: Scale.fit's cost-unit bounds would shrink a step to a sliver
        parts.append("<h2>One step, measured and simulated</h2>")
        if comparison:
            parts.append(f'<p class="when">{escape(comparison)}</p>')
        parts.append(f'<div class="chart">{gantt_svg(measured, scale)}</div>')
        parts.append(f'<div class="chart">{gantt_svg(simulated, scale)}</div>')
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _points(rows: Sequence[dict], x: str, y: str) -> tuple[tuple[float, float], ...]:
    """(row[x], row[y]) of the rows that have a number there (a skipped step's loss is null)."""
    return tuple((r[x], r[y]) for r in rows if r.get(y) is not None)


def _memory_series(rows: Sequence[dict]) -> list[Series]:
    """One curve per rank, in the action colours (lighter shades past the fourth rank)."""
    ranks = max((len(r["peak_memory_bytes"]) for r in rows), default=0)  # none where nothing was gathered
    kinds = list(BASE)
    shades = -(-ranks // len(kinds))
    return [Series(f"rank {r}", tuple((row["step"], row["peak_memory_bytes"][r] / 2**30) for row in rows
                                      if len(row["peak_memory_bytes"]) > r),
                   box_colour(kinds[r % len(kinds)], r // len(kinds), shades))
            for r in range(ranks)]


def _summary_table(rows: Sequence[dict]) -> str:
    if not rows:
        return '<p class="note">No logging interval was recorded.</p>'
    last = rows[-1]
    evals = [r for r in rows if "eval_loss" in r]
    cells = [("steps", f"{last['step']}"), ("loss (last interval)", _number(last["loss"], ".5f")),
             ("median tokens/s", f"{statistics.median(r['tokens_per_s'] for r in rows):.4g}"),
             ("median step time", f"{1000 * median_step_s(rows):.2f} ms"),
             ("peak memory (largest rank)", f"{max(last['peak_memory_bytes'], default=0) / 2**30:.3g} GiB")]
    if evals:
        last_eval = evals[-1]
        cells.insert(2, ("eval loss (last)", f"{_number(last_eval['eval_loss'], '.5f')} "
                                             f"(perplexity {_number(last_eval['eval_perplexity'], '.4g')})"))
    if "mfu" in last:
        cells.append(("MFU (median)", f"{100 * statistics.median(r['mfu'] for r in rows if 'mfu' in r):.1f}%"))
    bubble = bubble_interval(rows)
    if bubble is not None:
        cells.append((f"bubble (median interval, step {bubble['step']}): measured, simulated",
                      f"{100 * bubble['bubble_share']:.1f}%, {100 * bubble['simulated_bubble_share']:.1f}%"))
    head = "".join(f"<th>{escape(name)}</th>" for name, _ in cells)
    body = "".join(f"<td>{escape(value)}</td>" for _, value in cells)
    return f"<table><tr>{head}</tr><tr>{body}</tr></table>"


def _number(value: Optional[float], spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _end(timeline: Timeline) -> float:
    return max((s.end for rank in timeline.spans for s in rank), default=1.0)
