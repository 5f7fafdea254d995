"""The V family and zb-auto at the 1T layout (p = 64, m = 512 microbatches of 1): CPU seconds per
build, and what each build is, to compare two versions of the planner.

The requests are the advisor's own for Megatron-LM's 1T row with its layout fixed (TP 8 x PP 64 x
DP 6, ``advise_scale.py 1t-fixed``): recorded by running that search with every build skipped,
then built here in the search's order in one process (the builds share what a search shares).
zb-auto with 2 chunks is built too, past the planner's size check (this measures it).

    PYTHONPATH=src python benchmarks/v_family_scale.py

Per build: CPU seconds (``time.process_time``: build, validation and the simulation under its
costs), makespan, bubble, the largest per-rank peak, and a digest of the per-rank peaks and of the
orders (equal digests: the same schedule).
"""

from __future__ import annotations

import hashlib
import time

import pipesched.advise.search as advise_search
from pipesched import registry
from pipesched.advise.layout_search import advise_whole_layouts
from pipesched.advise.published import MEGATRON_1T
from pipesched.errors import ConfigError
from pipesched.simulate import simulate
from pipesched.validate import validate

FAMILIES = ("zb-v", "v-half", "v-min", "zb-auto")


def recorded_requests() -> list:
    """(family, BuildRequest) of every V-family and zb-auto build the 1T layout's search asks
    for under the layout's memory limit, in its order."""
    asked = []

    def record(family, request):
        asked.append((family, request))
        raise ConfigError("recorded, not built")

    kept = registry.built, registry.check_schedule_size, advise_search.default_workers
    registry.built, registry.check_schedule_size = record, lambda *args, **kwargs: 0.0
    advise_search.default_workers = lambda *args, **kwargs: 1  # recorded in this process, not in workers
    try:
        run = MEGATRON_1T
        advise_whole_layouts(run.gpus, run.model(), run.global_batch, run.fabric(),
                             fixed={"pp": 64, "tp": 8, "dp_replicate": 6, "dp_shard": 1},
                             sequence_parallel=run.sequence_parallel)
    except ConfigError:
        pass  # every build skipped: no layout fits
    finally:
        registry.built, registry.check_schedule_size, advise_search.default_workers = kept
    return [(f, r) for f, r in asked if f.name in FAMILIES and r.memory_limit is not None]


def main() -> None:
    for family, request in recorded_requests():
        started = time.process_time()
        schedule = registry.built(family, request)
        result = simulate(validate(schedule), request.costs)
        seconds = time.process_time() - started
        peaks = hashlib.sha1(repr(result.peak_memory).encode()).hexdigest()[:8]
        orders = hashlib.sha1(repr(schedule.orders).encode()).hexdigest()[:8]
        print(f"{family.name} ({request.chunks}): {seconds:.1f} CPU s, makespan {result.makespan:.6f}, "
              f"bubble {result.bubble_ratio:.6f}, peak {result.max_peak_memory:g}, peaks {peaks}, orders {orders}",
              flush=True)


if __name__ == "__main__":
    main()
