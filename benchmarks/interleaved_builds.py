"""CPU seconds of each interleaved-zb and interleaved-1f1b build, with a digest of its orders,
so that two checkouts can be compared build by build: same digests (same schedules), and the
time each takes.

Settings: chunks 2 and 4, p in 4..64, m in p..8p (up to 512); costs ``unit`` or ``1t`` (the
1T row's F/B/W/comm as the advisor prices its pp 32 group, first and last stage heavier);
memory limit ``none`` or ``limit`` (p/2 + 1 M_B: the fills must free memory).

    PYTHONPATH=src python benchmarks/interleaved_builds.py 1t-limit
    PYTHONPATH=../base/src python benchmarks/interleaved_builds.py 1t-limit   # the other checkout
"""

from __future__ import annotations

import hashlib
import sys
import time

from pipesched.costs import UNIT, Costs
from pipesched.schedules import interleaved, interleaved_zb


def one_t(stages: int) -> Costs:
    """The 1T row's per-microbatch costs (ms) at pp 32 x tp 8, with an embedding and a loss stage."""
    multipliers = [1.0] * stages
    multipliers[0], multipliers[-1] = 1.04, 1.21
    return Costs(F=49.07863855865669, B=49.68775009938735, W=45.7428496845927, comm=0.8651226666666666,
                 stage_multipliers=tuple(multipliers))


def run(combo: str) -> None:
    kind, limited = combo.split("-")
    total = 0.0
    for p in (4, 8, 16, 32, 64):
        for m in (m for m in (p, 2 * p, 4 * p, 8 * p) if m <= 512):
            for v in (2, 4):
                costs = UNIT if kind == "unit" else one_t(p * v)
                limit = None if limited == "none" else p / 2 + 1
                for name, build in (("interleaved-zb", interleaved_zb.build),
                                    ("interleaved-1f1b", interleaved.build_interleaved)):
                    started = time.process_time()
                    schedule = build(p, m, v, costs, limit)
                    seconds = time.process_time() - started
                    total += seconds
                    digest = hashlib.sha1(repr(schedule.orders).encode()).hexdigest()[:16]
                    print(f"{combo} {name} p={p} m={m} v={v} limit={limit} {digest} {seconds:.3f} CPU s", flush=True)
    print(f"{combo}: {total:.1f} CPU s")


if __name__ == "__main__":
    for combo in sys.argv[1:] or ["unit-none", "unit-limit", "1t-none", "1t-limit"]:
        run(combo)
