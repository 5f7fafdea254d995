"""Evaluate candidates on several processes: each build and simulation is independent.

Uses ``fork`` so that the work (a closure over the cost model and the settings) reaches the
workers without pickling; results come back pickled. Falls back to one process where fork is
unavailable or unsafe (after torch has started its threads, as in ``train --schedule auto``).
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
from typing import Callable, Optional, Sequence, TypeVar, Union

from ..environment import local_cores
from ..errors import PipeschedError

T = TypeVar("T")
R = TypeVar("R")

MAX_WORKERS = 8
MIN_CPUS = 4  # on two shared cores, measured: two workers were no faster than one on a search of a second
LARGE_WORK_S = 8.0  # predicted CPU seconds from which every core is used, however few (benchmarks/RESULTS.md)
_TASK: Optional[tuple[Callable, Sequence]] = None


def default_workers(jobs: int, seconds: float = 0.0) -> int:
    """Processes worth starting for ``jobs`` independent evaluations predicted to take ``seconds``
    of CPU in all (:func:`pipesched.planning.planning_seconds`): every core for large work, else
    every core only where there are at least :data:`MIN_CPUS`."""
    cpus = local_cores()
    if jobs < 2 or "torch" in sys.modules or "fork" not in multiprocessing.get_all_start_methods():
        return 1
    if seconds >= LARGE_WORK_S or (cpus >= MIN_CPUS and jobs >= 4):
        return min(cpus, MAX_WORKERS, jobs)
    return 1


def map_outcomes(fn: Callable[[T], R], items: Sequence[T], workers: int,
                 weights: Optional[Sequence[float]] = None) -> list[Union[R, PipeschedError]]:
    """``fn`` over ``items``, returned in their order; a :class:`PipeschedError` becomes that item's
    outcome. ``weights`` (predicted cost) only orders the dispatch, heaviest first, so that the
    workers finish together: a free worker takes the heaviest item left."""
    global _TASK
    workers = min(workers, len(items))
    if workers <= 1:
        return [_outcome(fn, item) for item in items]
    order = sorted(range(len(items)), key=lambda i: -weights[i]) if weights is not None else list(range(len(items)))
    _TASK = (fn, items)
    try:
        # Ctrl-C reaches the terminal's whole process group: the command alone answers it (the
        # pool's workers are stopped when it unwinds) instead of each worker printing a traceback
        ignore_sigint = (signal.SIGINT, signal.SIG_IGN)
        with multiprocessing.get_context("fork").Pool(workers, signal.signal, ignore_sigint) as pool:
            done = pool.map(_call, order, chunksize=1)
    finally:
        _TASK = None
    outcomes: list = [None] * len(items)
    for index, outcome in zip(order, done):
        outcomes[index] = outcome
    return outcomes


def _call(index: int):
    fn, items = _TASK
    return _outcome(fn, items[index])


def _outcome(fn, item):
    try:
        return fn(item)
    except PipeschedError as err:
        return err
