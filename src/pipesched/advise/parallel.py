"""Evaluate candidates on several processes: each build and simulation is independent.

Uses ``fork`` so that the work (a closure over the cost model and the settings) reaches the
workers without pickling; results come back pickled. Falls back to one process where fork is
unavailable or unsafe (after torch has started its threads, as in ``train --schedule auto``).
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
from typing import Callable, Hashable, Optional, Sequence, TypeVar, Union

from ..environment import local_cores
from ..errors import PipeschedError

T = TypeVar("T")
R = TypeVar("R")

MAX_WORKERS = 8
MIN_CPUS = 4  # two workers on two cores under load 3.5 were slower than one (benchmarks/RESULTS.md, Advisor)
LARGE_WORK_S = 4.0  # predicted CPU seconds from which every core is used, however few: a whole-layout
# group's settings on 2 workers take the CPU of 1 and half its critical path (RESULTS.md, issue 37 search-par;
# 8 s under the planning rates before the speed merges, about twice today's)
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


def map_outcomes(fn: Callable[[T], R], items: Sequence[T], workers: int, weights: Optional[Sequence[float]] = None,
                 together: Optional[Callable[[T], Hashable]] = None) -> list[Union[R, PipeschedError]]:
    """``fn`` over ``items``, returned in their order; a :class:`PipeschedError` becomes that item's
    outcome. ``weights`` (predicted cost) only orders the dispatch, heaviest first, so that the
    workers finish together: a free worker takes the heaviest task left. ``together(item)``: items
    with the same key (None: none) are one task, run in their order in one worker, so that what
    the first memoizes (a builder's programs) serves the others as in one process; a task heavier
    than a worker's even share of the weights gives up its last items (:func:`_within_share`)."""
    global _TASK
    tasks: dict[Hashable, list[int]] = {}
    for index, item in enumerate(items):
        key = together(item) if together is not None else None
        tasks.setdefault((index,) if key is None else ("together", key), []).append(index)
    workers = min(workers, len(tasks))
    if workers <= 1:
        return [_outcome(fn, item) for item in items]
    weights = weights if weights is not None else [1.0] * len(items)
    order = sorted(_within_share(list(tasks.values()), weights, workers), key=lambda task: -sum(weights[i] for i in task))
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
    for task, results in zip(order, done):
        for index, outcome in zip(task, results):
            outcomes[index] = outcome
    return outcomes


def _within_share(tasks: list[list[int]], weights: Sequence[float], workers: int) -> list[list[int]]:
    """Tasks of items kept together, each above a worker's even share of the weight split from its
    end, item by item, until it is within: one task longer than the others' sum would decide the
    wall time on its own, whatever memoizing saves."""
    share = sum(weights) / workers
    out = []
    for task in tasks:
        while len(task) > 1 and sum(weights[i] for i in task) > share:
            out.append([task.pop()])
        out.append(task)
    return out


def _call(task: list[int]) -> list:
    fn, items = _TASK
    return [_outcome(fn, items[index]) for index in task]


def _outcome(fn, item):
    try:
        return fn(item)
    except PipeschedError as err:
        return err
