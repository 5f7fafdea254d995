"""CPU seconds per action built, for every registered family (what pipesched.planning charges).

Each family is built and simulated once per size under skewed costs (so the searching families
search), in this process, and timed in CPU seconds (``time.process_time``: a shared machine's
load inflates the wall time, not this). ``us/built`` is what :data:`pipesched.planning.SECONDS_PER_ACTION`
must bound for the family's kind (``Family.planning``); ``us/out`` is per action of the result.

    python benchmarks/planning_rates.py 8x32 16x64 32x256      # sizes as RANKSxMICROBATCHES
    python benchmarks/planning_rates.py --check 32x256 64x512  # exit 1 if a rate exceeds its charge

The charges are this machine's: ``--check`` holds them to it (tests/test_planning.py checks
them only against each other, so that the suite passes on a slower machine). They bound the
sizes where a refusal can happen (seconds of planning): below 32x256 a build takes milliseconds,
most of them fixed costs (a construction at 16x64: 2-7 us an action, varying run to run).
"""

from __future__ import annotations

import sys
import time

from pipesched.costs import Costs
from pipesched.planning import actions_built, seconds_per_action
from pipesched.registry import build_schedule, families, forget_builds
from pipesched.simulate import simulate

SKEWED = Costs(1, 1.4, 0.6, comm=0.1)


def main(sizes: list[tuple[int, int]], check: bool) -> int:
    over = []
    for family in families():
        for ranks, microbatches in sizes:
            if family.name == "dualpipe" and ranks % 2:
                continue
            forget_builds()  # built from scratch: zb-auto would take its seeds from the families built before it
            started = time.process_time()
            schedule = build_schedule(family.name, ranks, microbatches, None, SKEWED)
            simulate(schedule, SKEWED)
            taken = time.process_time() - started
            built = actions_built(family, ranks, microbatches, None)
            print(f"{family.name:17s} {family.planning:12s} charged {1e6 * seconds_per_action(family):3.0f} us  "
                  f"p={ranks:3d} m={microbatches:4d}  built {built:9d}  cpu {taken:7.3f} s  "
                  f"us/built {1e6 * taken / built:6.2f}  us/out {1e6 * taken / len(schedule):7.2f}", flush=True)
            if taken > built * seconds_per_action(family):
                over.append(f"{family.name} at p={ranks} m={microbatches}")
    if check and over:
        print("charged less than it took: " + ", ".join(over))
        return 1
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sizes = [tuple(int(x) for x in arg.split("x")) for arg in args if arg != "--check"]
    sys.exit(main(sizes or [(8, 32), (16, 64)], check="--check" in args))
