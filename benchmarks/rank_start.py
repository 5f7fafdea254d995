"""CPU (user + sys, every process) of starting N ranks that import torch and build an optimizer:
the ``spawn`` start method (each rank imports everything) against ``forkserver`` with torch,
``torch._dynamo`` (which any torch optimizer imports) and ``torch.distributed`` preloaded once.

    python benchmarks/rank_start.py spawn 2
    python benchmarks/rank_start.py forkserver 2
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.forkserver as forkserver
import resource
import sys

PRELOAD = ["torch", "torch._dynamo", "torch.distributed"]


def rank(done) -> None:
    import torch

    torch.set_num_threads(1)
    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)  # imports torch._dynamo
    done.put(True)


def start(method: str, ranks: int) -> None:
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    done = ctx.Queue()
    procs = [ctx.Process(target=rank, args=(done,)) for _ in range(ranks)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if method == "forkserver":
        forkserver._forkserver._stop()  # reaped, so that its CPU counts


def main() -> None:
    method, ranks = sys.argv[1], int(sys.argv[2])
    start(method, ranks)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"{method}, {ranks} ranks: {usage.ru_utime + usage.ru_stime:.1f} s CPU in child processes")


if __name__ == "__main__":
    main()
