"""When each action ran: the host clock on CPU, CUDA events on a GPU.

On a GPU the host runs ahead of the device, so host timestamps tell when kernels were queued,
not when they ran. Synchronising after every action would make them true, but it would also
hold the host until the action's sends had been received, serialising communication with
compute. So on a GPU every action records an event before and after itself on the compute
stream (after its input's wait, so the start event fires once the input has arrived), and the
events are read once per step, after the step's work, against an event recorded at its start.
"""

from __future__ import annotations

from time import perf_counter
from typing import Any, Callable, Optional


class HostClock:
    """Seconds since the step's start on the host; ``synchronize`` (if given) runs after every
    action, so that on a GPU the end is when the action's work is done."""

    def __init__(self, synchronize: Optional[Callable[[], None]] = None) -> None:
        self.synchronize = synchronize
        self.t0 = 0.0

    def start(self) -> None:
        self.t0 = perf_counter()

    def mark(self) -> float:
        return perf_counter() - self.t0

    def mark_end(self) -> float:
        if self.synchronize is not None:
            self.synchronize()
        return self.mark()

    def seconds(self, marks: list[Any]) -> list[float]:
        return marks


class EventClock:
    """Events on the current stream, read (in seconds since the step's start event) after one
    synchronisation at the end of the step."""

    def __init__(self, new_event: Optional[Callable[[], Any]] = None,
                 synchronize: Optional[Callable[[], None]] = None) -> None:
        import torch

        self.new_event = new_event or (lambda: torch.cuda.Event(enable_timing=True))
        self.synchronize = synchronize or torch.cuda.synchronize
        self.origin: Any = None

    def _record(self) -> Any:
        event = self.new_event()
        event.record()
        return event

    def start(self) -> None:
        self.origin = self._record()

    def mark(self) -> Any:
        return self._record()

    mark_end = mark

    def seconds(self, marks: list[Any]) -> list[float]:
        self.synchronize()
        return [self.origin.elapsed_time(event) / 1000.0 for event in marks]  # elapsed_time: ms
