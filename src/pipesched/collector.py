"""The cyclic garbage collector paused while a schedule is built, lowered or simulated.

At the advisor's sizes (p = 64, m = 512: hundreds of thousands of actions per candidate) a build
and a simulation allocate millions of small tuples and lists that stay alive. CPython's collector
runs every few hundred allocations and, each time an older generation fills, walks every live
container: zb-h2's complete search at p = 64, m = 512 took 4.4-4.6 CPU s with it running and
3.3 s with it off (the search benchmarks/price_candidate.py times, before this pause). What these
paths allocate in bulk (actions, ids, times, spans) forms no reference cycles, so the collector
finds next to nothing to free there; pausing it changes no result, and anything cyclic a builder
makes meanwhile is collected at the first collection after.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic collector for the block (or, as a decorator, the call); restore it after,
    so nested pauses and callers that disabled it themselves keep their state."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
