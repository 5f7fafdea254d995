"""Action timestamps: the host clock on CPU; on a GPU, events read once after the step."""

from __future__ import annotations

from time import perf_counter, sleep

import pytest

from pipesched.runtime.metering.clock import EventClock, HostClock


class FakeEvent:
    """Stands in for torch.cuda.Event: remembers when it was recorded, on the host clock."""

    def __init__(self) -> None:
        self.at = None

    def record(self) -> None:
        self.at = perf_counter()

    def elapsed_time(self, later: "FakeEvent") -> float:
        return 1000.0 * (later.at - self.at)  # milliseconds, as CUDA's


def test_event_clock_reads_every_mark_once_after_the_step():
    syncs = []
    clock = EventClock(new_event=FakeEvent, synchronize=lambda: syncs.append(1))
    clock.start()
    start = clock.mark()
    sleep(0.01)
    end = clock.mark_end()
    assert not syncs  # nothing waits while the step runs
    first, second = clock.seconds([start, end])
    assert syncs == [1]
    assert 0 <= first < second and second - first == pytest.approx(0.01, abs=0.008)


def test_host_clock_synchronises_after_each_action_when_asked():
    syncs = []
    clock = HostClock(lambda: syncs.append(1))
    clock.start()
    start = clock.mark()
    end = clock.mark_end()
    assert syncs == [1]
    assert clock.seconds([start, end]) == [start, end] and 0 <= start <= end
