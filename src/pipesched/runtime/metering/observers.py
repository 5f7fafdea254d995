"""What watches the engine's actions: the clock that times them, the meter's sizes learned on the
first step, and the step's result assembled from their marks.

The engine's loop only marks each action's start and end (and reads the activation meter's
counters); everything derived from those marks is here, once per step, or, for the stage sizes,
once per run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

import torch

from ...execution import Span
from ...memory import StageMemory
from ...ops import Op
from .clock import EventClock, HostClock
from .exchange_waits import EXCHANGE_WAITS


@dataclass
class StepResult:
    """The true mean loss of the step (on every rank), this rank's step time and action spans."""

    loss: float
    step_time: float
    spans: list[Span]
    skipped: bool = False
    origin: float = 0.0  # this rank's perf_counter() at the step's start (same clock on one host)
    grad_norm: float = float("nan")  # the whole model's gradient norm before clipping (with clipping)
    # measured on a metered step (RuntimeOptions.meter_every_step; None on the others): saved
    # tensors, W stashes and stage inputs held at once, and (seconds from the start, bytes held)
    # per action edge
    peak_activation_bytes: Optional[int] = None
    activation_curve: list = field(default_factory=list)
    device_peak_bytes: Optional[int] = None  # CUDA: max_memory_allocated during the step
    device_baseline_bytes: Optional[int] = None  # CUDA: allocated at the step's start (weights, grads, optimizer)
    # seconds the step's program waited on expert exchanges (all-to-all not hidden; exchange_waits.py)
    exposed_exchange_s: float = 0.0


def make_clock(device: torch.device, sync_actions: Optional[bool]):
    """Events on CUDA (unless ``sync_actions`` says otherwise), the host clock elsewhere."""
    if device.type != "cuda" or sync_actions is False:
        return HostClock()
    if sync_actions:
        return HostClock(lambda: torch.cuda.synchronize(device))
    return EventClock()


def step_result(loss: float, step_time: float, marks: list, clock, skipped: bool, origin: float,
                grad_norm: float, peak_bytes: Optional[int], device: torch.device,
                device_baseline: Optional[int]) -> StepResult:
    """The step's result from the engine's marks: (action, start, end, highest bytes, bytes after),
    and the exchange waits of its program (the engine's run zeroes them first);
    ``peak_bytes`` None on a step the meter did not count (no activation curve then)."""
    times = clock.seconds([t for mark in marks for t in mark[1:3]])
    spans = [Span(mark[0], times[2 * i], times[2 * i + 1]) for i, mark in enumerate(marks)]
    # a forward's bytes show from its start, a backward's highest (a recomputation) too
    curve = [point for i, mark in enumerate(marks) for point in ((times[2 * i], mark[3]), (times[2 * i + 1], mark[4]))
             ] if peak_bytes is not None else []
    on_cuda = device.type == "cuda"
    return StepResult(loss, step_time, spans, skipped, origin, grad_norm, peak_bytes, curve,
                      torch.cuda.max_memory_allocated(device) if on_cuda else None, device_baseline,
                      EXCHANGE_WAITS.seconds)


class SizeLearner:
    """Per-stage activation sizes from the first step (the largest over its microbatches): what
    one ``F`` keeps, what an ``I`` leaves for ``W``, what a backward holds above its start."""

    def __init__(self) -> None:
        self.sizes: dict[int, StageMemory] = {}
        self.done = False

    def observe(self, action, before: int, after: int, high: int) -> None:
        s, kind, _k = action
        seen = self.sizes.get(s, StageMemory(0, 0))
        if kind is Op.F:
            seen = replace(seen, keep=max(seen.keep, after - before))
        elif kind is Op.B:
            seen = replace(seen, backward_extra=max(seen.backward_extra, high - before))
        elif kind is Op.I:  # apart from B's: a recomputed I also builds up its stash (dualpipe runs both)
            seen = replace(seen, stash=max(seen.stash, after - before + seen.keep),
                           input_backward_extra=max(seen.input_backward_extra or 0, high - before))
        self.sizes[s] = seen


def largest_sizes(learned: Sequence[dict[int, StageMemory]]) -> dict[int, StageMemory]:
    """Each stage's sizes over microbatches learned apart (one :class:`SizeLearner` each), as one
    learner over them all would learn them at most: the largest of each size, and a stash of the
    largest ``I`` change on top of the largest ``keep`` (a learner adds the ``keep`` seen so far)."""
    out: dict[int, StageMemory] = {}
    for s in sorted({s for sizes in learned for s in sizes}):
        seen = [sizes[s] for sizes in learned if s in sizes]
        split = [m for m in seen if m.input_backward_extra is not None]  # an I was learned
        keep = max(m.keep for m in seen)
        out[s] = StageMemory(keep=keep, stash=max(m.stash - m.keep for m in split) + keep if split else 0.0,
                             backward_extra=max(m.backward_extra for m in seen),
                             input_backward_extra=max(m.input_backward_extra for m in split) if split else None)
    return out
