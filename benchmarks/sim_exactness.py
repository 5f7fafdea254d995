"""Prove a change to the simulator core changes no result: every registered family built at
sizes up to p = 64, m = 512, simulated under several cost models (unit; comm, overhead and
multipliers; overlap and a fused backward) with sizes in bytes and recomputation, and each
result printed in full (``repr`` of every float; a digest of the schedule's CSV and of every
rank's timeline and memory curves). Run it with two trees' ``src`` and ``diff`` the outputs:
"identical" means equal lines (issue 37 item 5).

    PYTHONPATH=src python benchmarks/sim_exactness.py [--large] > out.txt

``--large`` adds the p = 32..64, m = 256..512 cases (minutes of CPU).
"""

from __future__ import annotations

import argparse
import hashlib
import time

from pipesched.costs import Costs
from pipesched.errors import PipeschedError
from pipesched.memory import MemorySizes, StageMemory
from pipesched.registry import build_schedule, families
from pipesched.simulate import simulate, unit_peaks

SMALL = ((4, 8), (8, 24), (16, 32))
LARGE = ((32, 256), (64, 512))
COSTS = (
    Costs(),
    Costs(F=1.0, B=1.3, W=0.7, comm=0.05, stage_overhead=0.1, stage_multipliers=(1.3, 1.0, 0.9, 1.1)),
    Costs(F=0.9, B=1.7, W=0.4, comm=0.013, overlap=0.6, full_backward=1.9),
)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def sizes(stages: int, recompute: frozenset) -> MemorySizes:
    """Uneven per-stage sizes in bytes, with blocks, so that recomputation and the W stash differ."""
    table = tuple(StageMemory(keep=1e9 + 3e7 * s, stash=4e8 + 1e7 * (s % 3), backward_extra=2e7 * (s % 2))
                  for s in range(stages))
    return MemorySizes(table, tuple(5e7 + 1e6 * s for s in range(stages)), recompute, tuple(1 + s % 4 for s in range(stages)))


def report(schedule, costs: Costs, memory) -> str:
    sim = simulate(schedule, costs, memory)
    curves = [sim.memory_curve(r) for r in range(schedule.ranks)]
    if memory is not None:
        curves += [sim.memory_curve(r, in_bytes=True) for r in range(schedule.ranks)]
    return (f"makespan={sim.makespan!r} span={sim.span!r} bubble={sim.bubble_ratio!r}\n"
            f"    busy={digest(repr(sim.busy))} peaks={sim.peak_memory!r}\n    bytes={sim.peak_memory_bytes!r}\n"
            f"    timeline={digest(repr(sim.timeline))} curves={digest(repr(curves))}")


def cases(large: bool):
    for ranks, m in SMALL + (LARGE if large else ()):
        for family in families():
            for chunks in sorted({family.resolve_chunks(None) or 1, 4 if family.name in ("interleaved-1f1b", "interleaved-zb") else 0} - {0}):
                if family.name in ("zb-auto",) and ranks * m > 8 * 24:
                    continue  # its MILP: minutes at scale, and not the simulator's cost
                yield family.name, ranks, m, chunks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", action="store_true")
    args = parser.parse_args()
    started = time.process_time()
    for name, ranks, m, chunks in cases(args.large):
        try:
            schedule = build_schedule(name, ranks, m, chunks if name not in ("zb-auto",) else None,
                                      costs=COSTS[1], memory_limit=None)
        except PipeschedError as err:
            print(f"{name} p={ranks} m={m} v={chunks}: {type(err).__name__}")
            continue
        print(f"{name} p={ranks} m={m} v={chunks}: csv={digest(schedule.to_csv())} unit_peaks={unit_peaks(schedule)!r}")
        for c, costs in enumerate(COSTS):
            print(f"  costs {c}: {report(schedule, costs, None)}")
        everything = frozenset(range(schedule.stages))
        for recompute in (frozenset(), frozenset(range(0, schedule.stages, 2)), everything):
            print(f"  bytes recompute={len(recompute)}: {report(schedule, COSTS[1], sizes(schedule.stages, recompute))}")
    own = build_schedule("zb-auto", 4, 8, costs=COSTS[1], memory_limit=1.5, recompute_input=0.2)
    print(f"zb-auto recomputing: csv={digest(own.to_csv())} meta={own.meta.get('recompute')!r} unit_peaks={unit_peaks(own)!r}")
    for c, costs in enumerate(COSTS):
        print(f"  costs {c}: {report(own, costs, None)}")
    print(f"# {time.process_time() - started:.1f} CPU s")


if __name__ == "__main__":
    main()
