"""The cost of pricing one candidate at the advisor's sizes: each family's complete search at the
Megatron-LM 1T layout (TP 8, DP = 3,072 / (8 p), m microbatches of 1; p = 64, m = 512 by default),
as the whole-layout search builds, simulates and prices it (issue 37 items 1 and 5).

    PYTHONPATH=src python benchmarks/price_candidate.py time [FAMILY ...] [--ranks P] [--microbatches M]
    PYTHONPATH=src python benchmarks/price_candidate.py check [FAMILY ...] [--ranks P] [--microbatches M]

``time``: CPU seconds (``time.process_time``) of each family's search at that layout, and every
candidate's makespan, bubble and per-rank peaks (M_B, then the priced row's bytes and step time),
printed in full (``repr``) so that two trees' outputs compare with ``diff``: run it with one
tree's ``src`` and then the other's, at the same moment, for figures side by side.
``check``: each family's schedule at that size lowered, and every action's dependency compared
with the rule asked one action at a time (the lowering's array lookups against
:mod:`pipesched.dependencies`).
"""

from __future__ import annotations

import argparse
import time

from pipesched.advise.layout_rows import pricer
from pipesched.advise.layout_search import LayoutProblem, costs_for
from pipesched.advise.published import MEGATRON_1T
from pipesched.advise.search import NoCandidateFitsError, advise
from pipesched.dependencies import dependency
from pipesched.errors import PipeschedError
from pipesched.lowering import MISSING, NO_DEPENDENCY
from pipesched.parallel_layout import ParallelLayout
from pipesched.registry import build_schedule, families

MINE = ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2", "interleaved-zb", "dualpipev")


def setup(ranks: int, microbatches: int):
    """The 1T layout with ``ranks`` pipeline ranks, its cost model and the search's pricing."""
    layout = ParallelLayout(ranks, MEGATRON_1T.gpus // (8 * ranks), 1, 8)
    problem = LayoutProblem(MEGATRON_1T.gpus, layout.dp * microbatches, MEGATRON_1T.fabric(), (),
                            sequence_parallel=MEGATRON_1T.sequence_parallel)
    costs = costs_for(problem, MEGATRON_1T.model(), layout)
    return costs, pricer([(layout, costs)], problem.fabric, problem.replica_latency)


def time_family(name: str, ranks: int, microbatches: int) -> None:
    costs, price = setup(ranks, microbatches)
    family = next(f for f in families() if f.name == name)
    started = time.process_time()
    try:
        found = advise(ranks, cost_model=costs, microbatches=microbatches, global_batch=microbatches,
                       families=[family], refuse_slow=False, price=price).candidates
    except NoCandidateFitsError as err:
        found = err.candidates
    print(f"{name} p={ranks} m={microbatches}: {time.process_time() - started:.2f} CPU s, {len(found)} candidates")
    for c in found:
        row = c.priced[0]
        print(f"  {c.schedule} v={c.chunks} recompute={c.recompute} makespan={c.makespan!r} "
              f"bubble={c.bubble_ratio!r} step={row.step_time!r}\n    peaks={c.peak_per_rank!r}\n"
              f"    bytes={[b['peak'] for b in row.bytes_per_rank]!r}")


def by_rule(action, index: dict, schedule) -> int:
    """The id of what ``action`` waits for, asked of the rule (:func:`dependency`) alone."""
    need = dependency(action, schedule.stages, schedule.pipelines)
    if need is None:
        return NO_DEPENDENCY
    stage, output, k = need
    return next((index[(stage, kind, k)] for kind in output.makers if (stage, kind, k) in index), MISSING)


def check_lowering(names: list[str], ranks: int, microbatches: int) -> None:
    for family in (f for f in families() if not names or f.name in names):
        chunks = family.min_chunks if family.max_chunks is not None else max(family.min_chunks, 2)
        try:
            schedule = build_schedule(family.name, ranks, microbatches, chunks)
        except PipeschedError as err:
            print(f"{family.name}: not built ({err})")
            continue
        program = schedule.program
        wrong = sum(d != by_rule(a, program.index, schedule) for a, d in zip(program.actions, program.dep))
        print(f"{family.name} p={ranks} m={microbatches} v={schedule.chunks}: {len(program.actions)} actions, "
              f"{wrong} dependencies differ from the rule")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("time", "check"))
    parser.add_argument("families", nargs="*", help=f"default: time {', '.join(MINE)}; check every family")
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=512)
    args = parser.parse_args()
    if args.what == "check":
        check_lowering(args.families, args.ranks, args.microbatches)
        return
    for name in args.families or MINE:
        time_family(name, args.ranks, args.microbatches)


if __name__ == "__main__":
    main()
