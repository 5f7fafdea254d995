"""Several ranks' engines in one process: an in-memory transport and a runner that interleaves them.

The engine (:mod:`.engine`) needs of its transport only what a program asks: post a receive,
wait for it, send, release, finish the step. :class:`LocalLinks` gives each rank of one process a
:class:`LocalTransport` with that interface over in-memory mailboxes (one per message: a message
is unique within a step), and :func:`run_engines` runs every rank's engine in its own thread, so
a rank that waits for a message blocks only itself. Nothing here touches ``torch.distributed``:
a schedule's programs, stage runners and reductions are checked against the unpipelined model in
one process (tests/test_runtime_engine.py), and a new instruction's handler can be tried the same way.
"""

from __future__ import annotations

import queue
import threading
from collections import defaultdict
from typing import Sequence

import torch

from ...actions import Action
from ..comm.p2p import PeerFailure, describe
from ..program.instructions import Message
from .engine import Engine, StepBatch


class LocalLinks:
    """The mailboxes every rank of this process sends into and receives from."""

    def __init__(self, timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        self._boxes: dict[Message, queue.Queue] = defaultdict(queue.Queue)
        self._lock = threading.Lock()

    def box(self, msg: Message) -> queue.Queue:
        with self._lock:
            return self._boxes[msg]

    def transport(self, rank: int) -> "LocalTransport":
        return LocalTransport(self, rank)


class LocalTransport:
    """One rank's end of :class:`LocalLinks`: a send is a copy put in the message's mailbox (the
    receiver owns what it gets, as over a wire), a receive waits for it, bounded by the timeout."""

    def __init__(self, links: LocalLinks, rank: int) -> None:
        self.links, self.rank = links, rank

    def start_step(self) -> None:
        pass

    def post(self, msg: Message) -> None:
        pass  # a mailbox takes the send whenever it comes

    def send(self, msg: Message, tensors: list[torch.Tensor]) -> None:
        self.links.box(msg).put([t.detach().clone() for t in tensors])

    def receive(self, msg: Message, action: Action) -> list[torch.Tensor]:
        try:
            return self.links.box(msg).get(timeout=self.links.timeout_s)
        except queue.Empty:
            raise PeerFailure(f"rank {self.rank} timed out after {self.links.timeout_s:g}s waiting at {action} "
                              f"for {describe(msg)}") from None

    def release_sent(self) -> None:
        pass

    def finish_step(self) -> None:
        pass


def run_engines(engines: Sequence[Engine], batches: Sequence[StepBatch], microbatches: int, clocks: Sequence) -> list:
    """One step of every rank's engine, each in its own thread; returns each rank's
    ``(losses, marks)``, or raises the first rank's error."""
    results: list = [None] * len(engines)
    errors: list = [None] * len(engines)

    def run(rank: int) -> None:
        try:
            results[rank] = engines[rank].run(batches[rank], microbatches, clocks[rank])
        except BaseException as err:  # noqa: BLE001 -- handed to the caller's thread
            errors[rank] = err

    threads = [threading.Thread(target=run, args=(r,), name=f"rank {r}") for r in range(len(engines))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for err in errors:
        if err is not None:
            raise err
    return results
