"""The whole-layout search on 1 and 2 worker processes: CPU, wall, and where the CPU goes.

    PYTHONPATH=src python benchmarks/advise_workers.py CASE WORKERS   (cases: advise_scale.py's, and pp32)

Prints a digest of every row, skipped line and searched line (equal digests: the same advice),
CPU (this process and its workers, ``resource.getrusage``), wall, the load average, and the
critical path: per searched group, the CPU of its busiest worker (each setting timed inside the
worker that ran it), summed over groups, plus the parent's own CPU. On a machine with the
workers' cores free, that is the wall the search takes; on shared cores the wall is longer.
"""

from __future__ import annotations

import collections
import hashlib
import os
import sys
import tempfile
import time

import advise_scale as scale
from pipesched.advise import search
from pipesched.advise.layout_search import advise_whole_layouts

scale.CASES["pp32"] = (scale.MEGATRON_1T, {"pp": 32, "tp": 8, "dp_replicate": 12, "dp_shard": 1})  # one 1T group
LOG = os.path.join(tempfile.mkdtemp(), "settings.log")  # a line per setting, appended by whichever worker ran it
_search_setting = search.search_setting


def timed_setting(setting, ranks, plan, model, *args, **kwargs):
    """:func:`search.search_setting`, its CPU logged with the group (its cost model) and worker."""
    started = time.process_time()
    try:
        return _search_setting(setting, ranks, plan, model, *args, **kwargs)
    finally:
        with open(LOG, "a") as log:
            log.write(f"{id(model)} {os.getpid()} {time.process_time() - started}\n")


def main(name: str, workers: int) -> None:
    run, fixed = scale.CASES[name]
    search.search_setting = timed_setting
    cpu, wall = scale._cpu(), time.perf_counter()
    advice = advise_whole_layouts(run.gpus, run.model(), run.global_batch, run.fabric(), fixed=fixed,
                                  sequence_parallel=run.sequence_parallel, precision=run.precision, workers=workers)
    cpu, wall = scale._cpu() - cpu, time.perf_counter() - wall
    busy: dict = collections.defaultdict(lambda: collections.defaultdict(float))  # group -> worker -> CPU s
    for line in open(LOG):
        group, pid, seconds = line.split()
        busy[group][pid] += float(seconds)
    in_settings = sum(sum(w.values()) for w in busy.values())
    path = sum(max(w.values()) for w in busy.values()) + cpu - in_settings
    digest = hashlib.sha256(repr((advice.candidates, advice.skipped, advice.searched)).encode()).hexdigest()[:16]
    print(f"{name} workers {workers}: digest {digest}, {len(advice.candidates)} rows, {cpu:.1f} CPU s, {wall:.1f} s wall "
          f"at load {os.getloadavg()[0]:.1f}; {len(busy)} groups searched, critical path {path:.1f} CPU s")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
