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
MIN_CPUS = 4  # on two shared cores, measured: two workers were no faster than one
_TASK: Optional[tuple[Callable, Sequence]] = None


def default_workers(jobs: int) -> int:
    """Processes worth starting for ``jobs`` independent evaluations."""
    cpus = local_cores()
    if jobs < 4 or cpus < MIN_CPUS or "torch" in sys.modules or "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return min(cpus, MAX_WORKERS, jobs)


def map_outcomes(fn: Callable[[T], R], items: Sequence[T], workers: int) -> list[Union[R, PipeschedError]]:
    """``fn`` over ``items`` in order; a :class:`PipeschedError` becomes that item's outcome."""
    global _TASK
    if workers <= 1:
        return [_outcome(fn, item) for item in items]
    _TASK = (fn, items)
    try:
        # Ctrl-C reaches the terminal's whole process group: the command alone answers it (the
        # pool's workers are stopped when it unwinds) instead of each worker printing a traceback
        ignore_sigint = (signal.SIGINT, signal.SIG_IGN)
        with multiprocessing.get_context("fork").Pool(workers, signal.signal, ignore_sigint) as pool:
            return pool.map(_call, range(len(items)), chunksize=1)
    finally:
        _TASK = None


def _call(index: int):
    fn, items = _TASK
    return _outcome(fn, items[index])


def _outcome(fn, item):
    try:
        return fn(item)
    except PipeschedError as err:
        return err
