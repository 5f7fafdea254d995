#!/usr/bin/env python3
"""Drawing costs: the big SVG (p=32, m=256, zb-v: ~50k boxes), its trace, and the HTML report.

    python benchmarks/render.py [--repeat 5]

Prints a markdown section for benchmarks/RESULTS.md. Times are medians over ``--repeat`` runs.
The report's browser cost is measured as headless Chromium's screenshot run on the report minus
the same run on an empty page (runs alternate, so machine noise hits both alike).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

import pipesched  # noqa: E402
from browser import chromium, screenshot  # noqa: E402
from pipesched.compare import simulate_all  # noqa: E402
from pipesched.render.html import report_html  # noqa: E402
from pipesched.render.svg import gantt_svg  # noqa: E402
from pipesched.render.trace import trace_json  # noqa: E402


def median_time(fn, repeat: int) -> tuple[float, object]:
    times, value = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    n = args.repeat
    rows = []

    schedule = pipesched.build_schedule("zb-v", 32, 256)
    t_sim, result = median_time(lambda: pipesched.simulate(schedule), n)
    t_svg, svg = median_time(lambda: gantt_svg(result), n)
    t_trace, trace = median_time(lambda: trace_json(result), n)
    rows.append(("simulate zb-v p=32 m=256", f"{len(schedule)} actions", t_sim))
    rows.append(("SVG Gantt, same timeline", f"{len(svg.encode()) / 1e6:.2f} MB", t_svg))
    rows.append(("Perfetto trace JSON, same timeline", f"{len(trace.encode()) / 1e6:.2f} MB", t_trace))

    costs = pipesched.Costs()
    t_report, page = median_time(lambda: report_html(simulate_all(8, 32, None, costs), "p=8, m=32"), n)
    rows.append(("HTML report p=8 m=32, every schedule (simulate + draw)",
                 f"{len(page.encode()) / 1e6:.2f} MB", t_report))

    browser_line = "chromium not installed: browser load not measured"
    if chromium():
        with tempfile.TemporaryDirectory() as tmp:
            report, empty = Path(tmp) / "report.html", Path(tmp) / "empty.html"
            report.write_text(page, encoding="utf-8")
            empty.write_text("<!DOCTYPE html><html><body></body></html>", encoding="utf-8")
            loads = {report: [], empty: []}
            for _ in range(n):
                for target in (empty, report):
                    start = time.perf_counter()
                    screenshot(target, Path(tmp) / "shot.png", 1400, 1000)
                    loads[target].append(time.perf_counter() - start)
        t_empty, t_full = statistics.median(loads[empty]), statistics.median(loads[report])
        browser_line = (f"headless Chromium screenshot run: report {t_full:.2f} s, empty page {t_empty:.2f} s, "
                        f"so loading and painting the report costs **{t_full - t_empty:.2f} s** (median of {n})")

    print("## Drawing\n")
    print(f"`python benchmarks/render.py --repeat {n}` (medians of {n} runs on this shared 2-core machine).\n")
    print("| what | output | time (s) |")
    print("|---|---:|---:|")
    for what, size, seconds in rows:
        print(f"| {what} | {size} | {seconds:.3f} |")
    print(f"\n{browser_line}.")
    print("\nTargets (issue 3): the big SVG under 2 s and under 10 MB; the report opens in under 1 s.")


if __name__ == "__main__":
    main()
