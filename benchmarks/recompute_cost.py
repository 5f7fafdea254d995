"""What activation checkpointing costs on its own: one process, one CPU thread, no pipeline.

A stack of the runtime's ``mlp`` blocks (LN -> Linear d->4d -> GELU -> Linear 4d->d, residual)
runs forward+backward several ways, taking turns: stored (plain autograd), each block its own
non-reentrant ``torch.utils.checkpoint`` region (what ``--recompute`` runs), the same with the
activation meter's counting of rebuilt tensors (its ``TorchDispatchMode``), and the forward
alone under ``no_grad``: stored + that forward is the floor, one extra forward and nothing else.
To place the rest: one region for the whole stack (the runtime's former granularity), and per
block without saving the RNG state (not what the runtime does: it shows that part's cost).
Times are the CPU time of the one thread (``time.thread_time``), not wall time: on a shared
machine the wall clock also counts the time spent waiting for a core. Medians of paired ratios over turns; at the
benchmark's width (256 -> 1024), twice that, and where kernels dominate (1024 -> 4096).

    PYTHONPATH=src python benchmarks/recompute_cost.py
"""

from __future__ import annotations

import statistics
import sys
from contextlib import nullcontext
from time import thread_time

import torch
from torch.utils.checkpoint import checkpoint

from pipesched.runtime.metering.memory_meter import ActivationMeter
from pipesched.training.models import ResidualMLP

SIZES = ((256, 1024, 8), (512, 2048, 8), (1024, 4096, 8), (1024, 4096, 64))  # (width, hidden, samples)
BLOCKS = 4


def _stored(blocks, x):
    for b in blocks:
        x = b(x)
    return x


def _checkpointed(meter=None, preserve_rng_state=True):
    def run(blocks, x):
        for b in blocks:
            if meter is None:
                x = checkpoint(b, x, use_reentrant=False, preserve_rng_state=preserve_rng_state)
            else:
                x = checkpoint(b, x, use_reentrant=False, context_fn=lambda: (nullcontext(), meter.recomputation()))
                meter.count_until_freed(x)
        return x
    return run


def _checkpointed_whole(blocks, x):
    """One region for the whole stack (the runtime's former stage granularity)."""
    return checkpoint(_stored, blocks, x, use_reentrant=False)


def _forward_only(blocks, x):
    """The forward alone, saving nothing: what a recomputation adds at best."""
    with torch.no_grad():
        return _stored(blocks, x)


def _time(fn, blocks, x) -> float:
    t0 = thread_time()
    loss = fn(blocks, x).square().mean()
    if loss.requires_grad:
        loss.backward()
    return thread_time() - t0


def main() -> int:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"{BLOCKS} mlp blocks, one thread: forward+backward time / stored forward+backward (median of paired turns)")
    for dim, hidden, samples in SIZES:
        blocks = [ResidualMLP(dim, hidden) for _ in range(BLOCKS)]
        x = torch.randn(samples, dim)
        variants = {"stored": _stored, "checkpoint": _checkpointed(), "checkpoint+meter": _checkpointed(ActivationMeter()),
                    "forward only": _forward_only, "whole": _checkpointed_whole,
                    "no rng": _checkpointed(preserve_rng_state=False)}
        turns = 30 if dim < 1024 else 10
        times = {name: [] for name in variants}
        for _ in range(2):  # warm-up
            for fn in variants.values():
                _time(fn, blocks, x)
        for _ in range(turns):
            for name, fn in variants.items():
                times[name].append(_time(fn, blocks, x))
        base = times["stored"]
        ratio = {n: statistics.median(a / b for a, b in zip(times[n], base)) for n in variants}
        print(f"  {dim}->{hidden}, {samples} samples: stored {statistics.median(base) * 1e3:.2f} ms CPU; "
              f"one extra forward {1 + ratio['forward only']:.2f}x, checkpoint {ratio['checkpoint']:.2f}x, "
              f"checkpoint + meter {ratio['checkpoint+meter']:.2f}x; checkpoint of the whole stack at once "
              f"{ratio['whole']:.2f}x, per block without saving the RNG state {ratio['no rng']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
