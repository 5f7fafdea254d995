"""Exposed all-to-all time: how long this rank's step waited on its expert exchanges.

An expert-parallel layer's dispatch and combine (:mod:`..sharding.expert_parallel`) start an
``all_to_all`` and later wait for it; only the wait is time the rank loses (the exchange is
*exposed*); while it is in flight the rank computes what it can, which for an interleaved
``OVERLAP_F_B`` pair is the other half (:mod:`..engine.pair_turns`). Run one half after the
other, each exchange is waited for as soon as it starts: all of it is exposed.

The exchanges are made deep inside a model's modules, so the sum is the process's, one
:data:`EXCHANGE_WAITS`: the executor zeroes it before a step's program and reads it after
(:attr:`~.observers.StepResult.exposed_exchange_s`). On CUDA a wait on NCCL only makes the stream
wait (the host does not block): the figure is host time there, not the device's.
"""

from __future__ import annotations

from time import perf_counter
from typing import Any


class ExchangeWaits:
    """Seconds waited on exchanges and how many, since the last :meth:`reset`."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.count = 0

    def reset(self) -> None:
        self.seconds, self.count = 0.0, 0

    def wait(self, work: Any) -> None:
        """Wait for ``work`` (an async collective's handle), the time counted."""
        start = perf_counter()
        work.wait()
        self.seconds += perf_counter() - start
        self.count += 1


EXCHANGE_WAITS = ExchangeWaits()  # this process's (one rank per process runs expert exchanges)
