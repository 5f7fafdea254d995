"""Schedule-core benchmark: formulas, torch comparison, speed. Prints Markdown for RESULTS.md.

    python benchmarks/schedules.py            # everything (torch part skipped without torch)
    python benchmarks/schedules.py --quick    # fewer configurations

1. Unit-cost figures of every family next to the closed forms of schedules.md.
2. Against torch.distributed.pipelining's generators (mocked stages) on p in {2,4,8}, m in 1..32
   that torch accepts, under unit costs and under skewed costs F,B,W = 1,1.4,0.6, comm 0.1.
   Families whose memory use is a choice (interleaved-1f1b, interleaved-zb) are given torch's
   peak as their limit, so "no slower at no more memory" is checked at torch's own trade-off;
   the last column counts the cases where the same family at its default limit (leaner than
   torch's peak there) is slower.
3. Time to build, validate and simulate zb-v at p=64, m=512 (median of repeated runs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import pipesched  # noqa: E402
from pipesched import Costs, build_schedule, get_family, simulate  # noqa: E402
from pipesched.registry import forget_builds  # noqa: E402

SKEWED = Costs(F=1, B=1.4, W=0.6, comm=0.1)


def formulas(quick: bool) -> None:
    print("## Unit-cost figures (F = B = W = 1, comm 0)\n")
    print("| schedule | p | m | v | makespan | span | bubble | peak | expected |")
    print("|---|---|---|---|---|---|---|---|---|")
    expected = {
        "gpipe": lambda p, m, v: f"makespan {3 * (m + p - 1)}, peak {m}",
        "1f1b": lambda p, m, v: f"makespan {3 * (m + p - 1)}, peak {min(p, m)}",
        "interleaved-1f1b": lambda p, m, v: f"makespan {3 * m + 3 * (p - 1) / v:g}, peak <= {(2 * (p - 1) + (v - 1) * p + 1) / v:g}",
        "looped-bfs": lambda p, m, v: f"makespan {3 * m + 3 * (p - 1) / v:g}",
        "zb-h1": lambda p, m, v: f"makespan {3 * m + p - 1}, peak <= {p}",
        "zb-h2": lambda p, m, v: f"span {3 * m}, peak <= {2 * p}",
        "zb-v": lambda p, m, v: f"span {3 * m}, peak <= {p}",
        "dualpipe": lambda p, m, v: f"makespan {3 * m + p - 2}, peak {p + 1} (2x parameters)",
    }
    configs = [(4, 8), (8, 32)] if quick else [(4, 8), (4, 16), (8, 16), (8, 32), (16, 64)]
    for family in pipesched.families():
        for p, m in configs:
            s = build_schedule(family.name, ranks=p, microbatches=m)
            r = simulate(s)
            exp = expected.get(family.name, lambda *_: "")(p, m, s.chunks)
            print(
                f"| {family.name} | {p} | {m} | {s.chunks} | {r.makespan:g} | {r.span:g} | "
                f"{100 * r.bubble_ratio:.1f}% | {r.max_peak_memory:g} | {exp} |"
            )
    print()


def versus_torch(quick: bool) -> None:
    try:
        from pipesched.interop.torch_schedules import torch_schedule
    except ImportError:
        print("(torch not installed: comparison skipped)\n")
        return
    try:
        import torch  # noqa: F401
    except ImportError:
        print("(torch not installed: comparison skipped)\n")
        return
    ms = range(1, 33, 3) if quick else range(1, 33)
    for label, costs in (("unit costs", Costs()), ("skewed costs F,B,W=1,1.4,0.6, comm 0.1", SKEWED)):
        print(f"## Against torch.distributed.pipelining ({label})\n")
        print("| schedule | cases | ours faster | equal | ours slower | ours leaner | mean makespan ratio ours/torch | best ratio "
              "| at our default limit: slower (leaner) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name in ("interleaved-1f1b", "looped-bfs", "interleaved-zb", "zb-v"):
            cases = faster = equal = slower = leaner = 0
            default_slower: list[str] = []
            ratios = []
            for p in (2, 4, 8):
                for m in ms:
                    theirs = torch_schedule(name, p, m)
                    if theirs is None:
                        continue
                    ref = simulate(theirs, costs)
                    limit = ref.max_peak_memory if get_family(name).uses_memory_limit else None
                    ours = simulate(build_schedule(name, p, m, costs=costs, memory_limit=limit), costs)
                    cases += 1
                    ratios.append(ours.makespan / ref.makespan)
                    if ours.makespan < ref.makespan - 1e-9:
                        faster += 1
                    elif ours.makespan > ref.makespan + 1e-9:
                        slower += 1
                    else:
                        equal += 1
                    if ours.max_peak_memory < ref.max_peak_memory - 1e-9:
                        leaner += 1
                    assert ours.max_peak_memory <= ref.max_peak_memory + 1e-9, (name, p, m)
                    if limit is not None:  # the same family at its default limit, for the record
                        lean = simulate(build_schedule(name, p, m, costs=costs), costs)
                        if lean.makespan > ref.makespan + 1e-9:
                            default_slower.append(
                                f"p={p} m={m}: {lean.makespan:.4g} at {lean.max_peak_memory:g} vs "
                                f"{ref.makespan:.4g} at {ref.max_peak_memory:g}")
            record = "; ".join(default_slower[:3]) + (f"; +{len(default_slower) - 3} more" if len(default_slower) > 3 else "")
            print(
                f"| {name} | {cases} | {faster} | {equal} | {slower} | {leaner} | "
                f"{statistics.mean(ratios):.4f} | {min(ratios):.4f} | "
                f"{len(default_slower)}{' (' + record + ')' if default_slower else ''} |"
            )
        print()


def speed(repeats: int) -> None:
    print("## Speed: build + validate + simulate zb-v, p=64, m=512 (196,608 actions)\n")
    wall, cpu = [], []
    for _ in range(repeats):
        forget_builds()  # each repeat builds again (a search's memo would hand the first back)
        start, start_cpu = time.perf_counter(), time.process_time()
        schedule = build_schedule("zb-v", ranks=64, microbatches=512)
        result = simulate(schedule)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    assert result.span == 3 * 512
    print(
        f"wall: median {statistics.median(wall):.3f} s, min {min(wall):.3f} s; "
        f"CPU time: median {statistics.median(cpu):.3f} s over {repeats} runs (target < 1 s). "
        "Wall time on a shared machine includes waiting for a core; CPU time does not.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    formulas(args.quick)
    versus_torch(args.quick)
    speed(3 if args.quick else 7)


if __name__ == "__main__":
    main()
