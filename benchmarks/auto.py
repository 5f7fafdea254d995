"""Automatic schedules benchmark: zb-auto and the V family. Prints Markdown for RESULTS.md.

    python benchmarks/auto.py            # everything (torch columns skipped without torch)
    python benchmarks/auto.py --quick    # fewer configurations

1. Unit costs: zb-auto at limit p against ZB-1p's span 3m+p-1; at limit 2p with objective span
   against zero bubble (span 3m).
2. Skewed costs (F,B,W = 1,1.4,0.6, comm 0.1; then also 1.3x first and last stage): zb-auto at
   limit p against every handcrafted schedule of ours and of torch (simulated under the same
   costs) whose peak fits p; the margin over the best of each; the MILP's status and the gap
   between the result and the proven lower bound where it runs (p*m <= 256).
3. V family at unit costs: peak memory and bubble against 1F1B's (published: 1/2 and 2/3).
3b. V-Half and V-Min against the authors' builder (its construction, reimplemented in
   pipesched.schedules.v_compact and checked equal to it in tests/golden), at unit costs, the
   skewed costs and the GPT's measured costs, at the same peak; the published bubble formula.
4. dualpipev (torch's DualPipeV order, with overlapped F&B pairs) at overlap factors 1, 0.5, 0
   against zb-v and zb-auto at its peak memory (p + 1/2).
4b. dualpipe (DeepSeek's bidirectional DualPipe, two model copies) against dualpipev and zb-v
   at unit costs and overlap factors 1, 0.5, 0: makespan and peak activations.
5. Speed: median wall time of zb-auto at p=16 m=64 and p=32 m=256 (greedy only), and the MILP's
   time against its bound.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from pipesched import ConfigError, Costs, PipeschedError, build_schedule, simulate  # noqa: E402
from pipesched.registry import forget_builds  # noqa: E402
from pipesched.auto import build_auto  # noqa: E402

SKEWED = Costs(F=1, B=1.4, W=0.6, comm=0.1)
OURS = ("1f1b", "zb-h1", "zb-h2", "interleaved-zb", "zb-v")
TORCH = ("1f1b", "interleaved-1f1b", "interleaved-zb", "zb-v", "dualpipev")


def heavy_ends(p: int) -> Costs:
    return Costs(F=1, B=1.4, W=0.6, comm=0.1, stage_multipliers=(1.3,) + (1.0,) * (p - 2) + (1.3,))


def unit_figures(quick: bool) -> None:
    print("### Unit costs: ZB-1p at limit p, zero bubble at limit 2p\n")
    print("| p | m | limit p: span | 3m+p-1 | chosen | limit 2p, objective span: span | 3m | chosen |")
    print("|---|---|---|---|---|---|---|---|")
    for p in (4, 8) if quick else (4, 8, 16):
        for m in (2 * p, 3 * p, 4 * p):
            one = build_auto(p, m, milp=False)
            two = build_auto(p, m, memory_limit=2 * p, objective="span", milp=False)
            r1, r2 = simulate(one), simulate(two)
            print(f"| {p} | {m} | {r1.span:g} | {3 * m + p - 1} | {one.meta['origin']} | "
                  f"{r2.span:g} | {3 * m} | {two.meta['origin']} |")
    print()


def _ours(p, m, costs):
    best = None
    for name in OURS:
        try:
            r = simulate(build_schedule(name, p, m, costs=costs, memory_limit=p), costs)
        except ConfigError:
            continue
        if best is None or r.makespan < best[1]:
            best = (name, r.makespan)
    return best


def _torch(p, m, costs):
    try:
        from pipesched.interop.torch_schedules import torch_schedule
    except ImportError:
        return None
    best = None
    for name in TORCH:
        try:
            s = torch_schedule(name, p, m, 2)
            r = simulate(s, costs) if s is not None else None
        except PipeschedError:
            continue  # e.g. torch's Schedule1F1B order, which misses the last rank's F0
        if r is None or r.max_peak_memory > p + 1e-9:
            continue
        if best is None or r.makespan < best[1]:
            best = (name, r.makespan)
    return best


def skewed(quick: bool) -> None:
    print("### Skewed costs at limit p (makespan; F,B,W = 1,1.4,0.6, comm 0.1)\n")
    print("| costs | p | m | zb-auto | chosen | best of ours | margin | best of torch | margin | "
          "MILP | lower bound | gap |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    configs = [(4, 8), (8, 16)] if quick else [(4, 8), (4, 16), (8, 16), (8, 32), (16, 32), (16, 64)]
    for label in ("uniform", "1.3x ends"):
        for p, m in configs:
            costs = SKEWED if label == "uniform" else heavy_ends(p)
            s = build_auto(p, m, costs)
            r = simulate(s, costs)
            ours, theirs = _ours(p, m, costs), _torch(p, m, costs)
            milp = s.meta.get("milp")
            milp_text = (f"{milp['status']} | {milp['lower_bound']:.4g} | {100 * milp['gap']:.1f}%"
                         if milp else "not run (p*m > 256) | | ")
            print(
                f"| {label} | {p} | {m} | {r.makespan:.4g} | {s.meta['origin']} | "
                f"{ours[0]} {ours[1]:.4g} | {100 * (ours[1] / r.makespan - 1):+.2f}% | "
                + (f"{theirs[0]} {theirs[1]:.4g} | {100 * (theirs[1] / r.makespan - 1):+.2f}% | "
                   if theirs else "(no torch) | | ")
                + milp_text + " |"
            )
    print("\nmargin = how much longer the other schedule's makespan is than zb-auto's.\n")


def v_family(quick: bool) -> None:
    print("### V family at unit costs (m = 4p)\n")
    print("| p | m | 1f1b bubble | v-half peak | (p+2)//2 | v-half bubble / 1f1b's | "
          "v-min peak | (p+4)//3 | v-min bubble / 1f1b's | zb-v span | 3m |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for p in (4, 8) if quick else (4, 6, 8, 12, 16):
        m = 4 * p
        base = simulate(build_schedule("1f1b", p, m)).span - 3 * m
        half = simulate(build_schedule("v-half", p, m))
        least = simulate(build_schedule("v-min", p, m))
        zbv = simulate(build_schedule("zb-v", p, m))
        print(f"| {p} | {m} | {base:g} | {half.max_peak_memory:g} | {(p + 2) // 2} | "
              f"{(half.span - 3 * m) / base:.2f} | {least.max_peak_memory:g} | {(p + 4) // 3} | "
              f"{(least.span - 3 * m) / base:.2f} | {zbv.span:g} | {3 * m} |")
    print()


MEASURED_GPT = Costs(F=9.3, B=9.92, W=5.3, comm=0.1)  # zb-v on the runtime's GPT, ms (Runtime section)


def v_against_paper(quick: bool) -> None:
    from pipesched import Schedule
    from pipesched.placement import v_placement
    from pipesched.schedules.v_blocks import v_half_offsets, v_min_offsets
    from pipesched.schedules.v_compact import compacted_orders

    print("### V-Half and V-Min against the authors' builder (same peak)\n")
    print("| family | costs | p | m | ours | peak | paper's builder | its peak | ours/paper | "
          "unit-cost formula 3m + f*3(p-1) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    settings = [(4, 16), (8, 32)] if quick else [(4, 16), (8, 24), (8, 32), (8, 64), (16, 48), (16, 64)]
    for family, offsets, fraction in (("v-half", v_half_offsets, 1 / 2), ("v-min", v_min_offsets, 2 / 3)):
        for label, costs in (("unit", Costs()), ("skewed", SKEWED), ("measured GPT", MEASURED_GPT)):
            for p, m in settings:
                ours = simulate(build_schedule(family, p, m, costs=costs), costs)
                paper = Schedule(p, m, v_placement(p), tuple(map(tuple, compacted_orders(p, m, offsets))))
                theirs = simulate(paper, costs)
                formula = f"{3 * m + fraction * 3 * (p - 1):.4g}" if label == "unit" else ""
                print(f"| {family} | {label} | {p} | {m} | {ours.makespan:.4g} | {ours.max_peak_memory:g} | "
                      f"{theirs.makespan:.4g} | {theirs.max_peak_memory:g} | "
                      f"{ours.makespan / theirs.makespan:.4f} | {formula} |")
    print()


def dualpipev(quick: bool) -> None:
    from dataclasses import replace

    print("### dualpipev (overlapped F&B) against zb-v and zb-auto at the same memory\n")
    print("| costs | overlap | p | m | dualpipev | its peak | zb-v at that limit | zb-auto at that limit | "
          "dualpipev vs best |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, base in (("unit", Costs()), ("skewed", SKEWED), ("measured GPT", MEASURED_GPT)):
        for p, m in [(4, 16)] if quick else [(4, 8), (4, 16), (8, 32)]:
            limit = p + 0.5
            zbv = simulate(build_schedule("zb-v", p, m, costs=base, memory_limit=limit), base)
            auto = simulate(build_auto(p, m, base, memory_limit=limit, milp=False), base)
            for overlap in (1.0, 0.5, 0.0):
                costs = replace(base, overlap=overlap)
                dual = simulate(build_schedule("dualpipev", p, m, costs=costs), costs)
                best = min(zbv.makespan, auto.makespan)
                print(f"| {label} | {overlap:g} | {p} | {m} | {dual.makespan:.4g} | {dual.max_peak_memory:g} | "
                      f"{zbv.makespan:.4g} | {auto.makespan:.4g} | {100 * (dual.makespan / best - 1):+.2f}% |")
    print()


def dualpipe(quick: bool) -> None:
    from dataclasses import replace

    print("### dualpipe (bidirectional, 2x parameters) against dualpipev and zb-v, unit costs\n")
    print("| overlap | p | m | dualpipe | its peak | dualpipev | its peak | zb-v | its peak | "
          "zb-v at dualpipe's peak | dualpipe vs dualpipev |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for p, m in [(4, 16)] if quick else [(4, 8), (4, 16), (8, 16), (8, 32)]:
        zbv = simulate(build_schedule("zb-v", p, m))
        zbv_more = simulate(build_schedule("zb-v", p, m, memory_limit=p + 1))
        for overlap in (1.0, 0.5, 0.0):
            costs = replace(Costs(), overlap=overlap)
            dual = simulate(build_schedule("dualpipe", p, m, costs=costs), costs)
            folded = simulate(build_schedule("dualpipev", p, m, costs=costs), costs)
            print(f"| {overlap:g} | {p} | {m} | {dual.makespan:.4g} | {dual.max_peak_memory:g} | "
                  f"{folded.makespan:.4g} | {folded.max_peak_memory:g} | {zbv.makespan:.4g} | "
                  f"{zbv.max_peak_memory:g} | {zbv_more.makespan:.4g} | "
                  f"{100 * (dual.makespan / folded.makespan - 1):+.2f}% |")
    print()


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        forget_builds()  # each repeat builds again (a search's memo would hand the first back)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def speed(quick: bool) -> None:
    print("### Speed (median wall time; shared 2-core machine)\n")
    print("| case | seconds | target |")
    print("|---|---|---|")
    repeats = 1 if quick else 3
    t = _median_seconds(lambda: build_auto(16, 64, SKEWED), repeats)
    print(f"| zb-auto p=16 m=64, skewed costs | {t:.2f} | < 2 |")
    if not quick:
        t = _median_seconds(lambda: build_auto(32, 256, SKEWED, milp=False), repeats)
        print(f"| zb-auto p=32 m=256, skewed costs, greedy only | {t:.2f} | < 10 |")
    for limit in (2.0, 6.0):
        s = build_auto(4, 8, heavy_ends(4), time_limit=limit)
        milp = s.meta["milp"]
        print(f"| zb-auto p=4 m=8 1.3x ends, time_limit {limit:g} s: MILP part | "
              f"{milp['seconds']:.2f} | <= {limit / 2:g} (half the budget) |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sections = {"unit": unit_figures, "skewed": skewed, "v-family": v_family,
                "v-paper": v_against_paper, "dualpipev": dualpipev, "dualpipe": dualpipe,
                "speed": speed}
    parser.add_argument("--quick", action="store_true", help="fewer configurations")
    parser.add_argument("--only", choices=sorted(sections), action="append",
                        help="run only these sections (repeatable)")
    args = parser.parse_args()
    print("## Automatic schedules (`python benchmarks/auto.py`)\n")
    print("Produced by `python benchmarks/auto.py`. Costs are per microbatch for one rank's "
          "share; memory in one microbatch's activations per rank (M_B).\n")
    for name, section in sections.items():
        if not args.only or name in args.only:
            section(args.quick)


if __name__ == "__main__":
    main()
