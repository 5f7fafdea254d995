"""zb-auto at the 1T layout (p = 64, m = 512 of 1, the advisor's costs and limit): CPU seconds of
one build from scratch, with its validation and simulation, and digests that say whether two
versions of the planner chose the same schedule (issue 37; benchmarks/RESULTS.md).

    PYTHONPATH=src python benchmarks/zb_auto_1t.py 1     # one chunk per rank
    PYTHONPATH=src python benchmarks/zb_auto_1t.py 2     # two (zb-auto past the planner's size check)

Run it once per version, in a fresh process each: equal makespan, bubble, peaks, orders and CSV
digests are the same schedule.
"""

from __future__ import annotations

import hashlib
import sys
import time

from pipesched import registry
from pipesched.simulate import simulate
from pipesched.validate import validate
from v_family_scale import recorded_requests


def main(chunks: int) -> None:
    request = next(r for f, r in recorded_requests() if f.name == "zb-auto" and r.chunks == chunks)
    started = time.process_time()
    schedule = registry.built(registry.get_family("zb-auto"), request)
    result = simulate(validate(schedule), request.costs)
    seconds = time.process_time() - started

    def digest(text: str) -> str:
        return hashlib.sha1(text.encode()).hexdigest()[:8]

    print(f"zb-auto ({chunks}): {seconds:.2f} CPU s, makespan {result.makespan!r}, bubble {result.bubble_ratio!r}, "
          f"peak {result.max_peak_memory!r}, peaks {digest(repr(result.peak_memory))}, "
          f"orders {digest(repr(schedule.orders))}, csv {digest(schedule.to_csv())}, origin {schedule.meta.get('origin')}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
