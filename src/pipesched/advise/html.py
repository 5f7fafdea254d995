"""The advice as an HTML fragment for the report: the recommendation, why, and the ranked table.

Plain HTML with no script or external resource, so the report stays one offline file; styling
comes from the page it is embedded in.
"""

from __future__ import annotations

from html import escape

from .explain import memory_text
from .search import Advice


def advice_html(advice: Advice, top: int = 10) -> str:
    """The recommendation, its reason and notes, and the ``top`` fitting candidates as a table."""
    best = advice.recommended
    parts = [f"<p><strong>Recommendation:</strong> {escape(advice.reason)}</p>"]
    if advice.notes:
        parts.append("<ul>" + "".join(f"<li>{escape(n)}</li>" for n in advice.notes) + "</ul>")
    if best.layers_per_stage:
        how = f" ({escape(best.layer_assignment)})" if best.layer_assignment else ""
        parts.append(f"<p>Layers per stage{how}: {escape(', '.join(map(str, best.layers_per_stage)))}</p>")
    shown = advice.fitting[:max(1, top)]
    if advice.baseline is not None and advice.baseline not in shown:
        shown.append(advice.baseline)
    unit = advice.objective
    rows = [
        "<table><tr><th>schedule</th><th>chunks</th><th>m</th>"
        f"<th>{escape(unit)}</th><th>bubble</th><th>peak memory</th><th>speed-up over 1f1b</th></tr>"
    ]
    for c in shown:
        cls = ' class="best"' if c is best else ""
        over = "" if c.fits else " (over limit)"
        speedup = f"{c.speedup_vs_1f1b:.3f}\u00d7" if c.speedup_vs_1f1b else "\u2013"
        rows.append(
            f"<tr><td{cls}>{escape(c.schedule)}</td><td>{c.chunks}</td><td>{c.microbatches}</td>"
            f"<td{cls}>{c.value(unit):.4g}</td><td>{100 * c.bubble_ratio:.1f}%</td>"
            f"<td>{escape(memory_text(c) + over)}</td><td>{speedup}</td></tr>"
        )
    rows.append("</table>")
    parts.append("\n".join(rows))
    parts.append(
        f"<p>{len(advice.fitting)} of {len(advice.candidates)} candidates fit the memory limit; "
        "each was built and simulated under the same costs.</p>"
    )
    return "\n".join(parts)
