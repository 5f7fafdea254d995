"""A rank's peak bytes on the step's timeline: activations plus the unsharded gradients it holds.

Under pipelining with FSDP (``dp_shard > 1``) each stage accumulates its gradients unsharded,
in the reduce dtype, from its first pass that computes weight gradients (``B``, or ``W`` under
a split backward) until its ``REDUCE_GRAD`` after its last such pass (torch's pipelining turns
the reduce-scatter off for every microbatch but the last). Before that first pass the stage
holds no gradient: a rank that runs its forwards first (a deep warm-up) reaches its activation
peak before any gradient exists, and frees activations as the gradients appear. Adding every
stage's gradients to the activation peak, as a constant, counts both at their highest at once;
this sums them on the simulated timeline instead. The other state bytes (shards, the gathered
window, buffers) are held the whole step and stay a constant.
"""

from __future__ import annotations

from itertools import compress
from operator import itemgetter
from typing import Sequence

import numpy as np

from ..ops import Op

_GRADIENT_PASSES = frozenset((Op.B, Op.W))  # the passes that compute weight gradients


def gradient_passes(spans) -> list[tuple[float, float, int]]:
    """(start, end, stage) per stage of one rank's timeline ``spans`` (action, start, end): from
    the start of its first ``B``/``W`` to the end of its last, stages in the order they start
    (the interval a stage's gradients are held; the bytes are the caller's, per stage)."""
    actions = list(map(itemgetter(0), spans))
    passes = list(map(_GRADIENT_PASSES.__contains__, map(itemgetter(1), actions)))  # C loops: 10^5+ spans
    stages = list(compress(map(itemgetter(0), actions), passes))
    starts = list(compress(map(itemgetter(1), spans), passes))
    last = dict(zip(stages, compress(map(itemgetter(2), spans), passes)))  # pairs into a dict keep the last
    return [(starts[stages.index(s)], last[s], s) for s in dict.fromkeys(stages)]


def peak_with_gradients(steps: np.ndarray, levels: np.ndarray,
                        intervals: Sequence[tuple[float, float, float]]) -> float:
    """Highest activations (a memory curve as arrays: from ``steps[i]`` on, ``levels[i]`` bytes
    are held; times in order, :meth:`pipesched.simulate.SimResult.memory_steps`) plus the
    gradients held at that time (``intervals``, closed: a gradient counts at its first pass's
    start and at its last pass's end).

    At every time a step or an interval's end falls on: the activation level then, plus the
    intervals holding it added in their order (an interval not holding it adds ``0.0``, which
    changes no float), so each sum is the one a per-time Python sum makes, by arrays."""
    ends = np.array([t for a, b, _ in intervals for t in (a, b)], float)
    times = np.unique(np.concatenate((steps, ends)))
    at = np.searchsorted(steps, times, side="right") - 1  # the last step at or before each time
    total = np.where(at >= 0, levels[np.maximum(at, 0)], 0.0)
    held = np.zeros(len(times))
    for a, b, size in intervals:
        held += np.where((a <= times) & (times <= b), size, 0.0)
    return max(0.0, float((total + held).max(initial=0.0)))
