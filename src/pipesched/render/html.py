"""The HTML report: every schedule for one configuration, in one self-contained offline file.

A metrics table first, then each schedule's chart on one shared time axis (same pixels per time
unit, so lengths compare across charts) with its "when to choose it" sentence. Inline SVG and
CSS only: no script, no font or stylesheet fetched from anywhere.

Other parts (the advisor's ranking) plug in as :class:`Section` objects, shown after the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Sequence

from ..compare import Outcome
from .layout import Scale
from .svg import gantt_svg

CSS = """
body{font-family:DejaVu Sans,Helvetica,Arial,sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 2px}
.config{color:#555;margin:0 0 16px}
table{border-collapse:collapse;font-size:13px;max-width:1100px}
th,td{padding:4px 10px;border-bottom:1px solid #ddd;text-align:right}
th:first-child,td:first-child{text-align:left;white-space:nowrap}
td.best{font-weight:bold;color:#006b3c}
td.error{color:#b00;text-align:left}
.over{color:#b00;font-weight:normal}
.when{margin:2px 0 8px;color:#444}
.chart{overflow-x:auto}
.chart svg{display:block}
.extra{margin-top:20px}
"""


@dataclass(frozen=True)
class Section:
    """An extra part of the report: a heading and a body of HTML the caller vouches for."""

    title: str
    html: str


def report_html(outcomes: Sequence[Outcome], config: str, sections: Sequence[Section] = ()) -> str:
    """The whole report page for ``outcomes`` (from :func:`pipesched.compare.simulate_all`)."""
    drawn = [o for o in outcomes if o.result is not None]
    longest = max((o.result.makespan for o in drawn), default=1.0)
    scale = Scale.fit(longest)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>pipesched report: {escape(config)}</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>Pipeline schedules compared</h1>",
        f'<p class="config">{escape(config)}. Times in cost units; all charts share one time axis.</p>',
        _metrics_table(outcomes),
    ]
    for section in sections:
        parts.append(f'<div class="extra"><h2>{escape(section.title)}</h2>{section.html}</div>')
    for outcome in drawn:
        name = outcome.family.name
        parts.append(f'<h2 id="{escape(name)}">{escape(name)}</h2>')
        parts.append(f'<p class="when">When to choose it: {escape(outcome.family.summary)}.</p>')
        parts.append(f'<div class="chart">{gantt_svg(outcome.result, scale)}</div>')
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _metrics_table(outcomes: Sequence[Outcome]) -> str:
    results = [o.result for o in outcomes if o.result is not None]
    best_makespan = min((r.makespan for r in results), default=None)
    best_memory = min((r.max_peak_memory for r in results), default=None)
    rows = [
        "<table><tr><th>schedule</th><th>v</th><th>makespan</th><th>span</th><th>bubble</th>"
        "<th>peak memory (M_B)</th><th>speed-up over 1f1b</th></tr>"
    ]
    for o in outcomes:
        name = escape(o.family.name)
        if o.result is None:
            rows.append(f'<tr><td>{name}</td><td>{o.chunks}</td><td class="error" colspan="5">{escape(o.error or "")}</td></tr>')
            continue
        r = o.result
        over = "" if o.fits else ' <span class="over">(over limit)</span>'
        speedup = f"{o.speedup_vs_1f1b:.3f}\u00d7" if o.speedup_vs_1f1b is not None else "\u2013"
        rows.append(
            f'<tr><td><a href="#{name}">{name}</a></td><td>{o.chunks}</td>'
            f"{_cell(f'{r.makespan:.4g}', r.makespan == best_makespan)}<td>{r.span:.4g}</td>"
            f"<td>{100 * r.bubble_ratio:.1f}%</td>"
            f"{_cell(f'{r.max_peak_memory:.3g}{over}', r.max_peak_memory == best_memory)}<td>{speedup}</td></tr>"
        )
    rows.append("</table>")
    return "\n".join(rows)


def _cell(text: str, best: bool) -> str:
    return f'<td class="best">{text}</td>' if best else f"<td>{text}</td>"
