"""Joining a torchrun group within ``--timeout``, or one line naming the address that failed.

With ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set (by torchrun, or left in a
shell), a rank joins the group through the store at ``MASTER_ADDR:MASTER_PORT``. torch bounds
some of that wait by the timeout, not all: a client whose store is a program that accepts the
connection and never answers (any other server on that port) waits for ever, in C++. So the join
runs under a deadline: when the group has not formed within the timeout, a watchdog thread
prints one line naming the rank and the address and ends the process (exit 1; the wait cannot
be interrupted otherwise). A join that fails sooner (the port in use by another program, a peer
gone) is one line as well, a :class:`~.rank_watch.DistributedRunError`.
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

from .rank_watch import DistributedRunError


def address() -> str:
    return f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"


@contextmanager
def joining(rank: int, world: int, timeout_s: float) -> Iterator[None]:
    """The block joins the group of ``world`` ranks as ``rank``: bounded by ``timeout_s``, its
    failure one line."""
    where = address()
    waited = (f"rank {rank} of {world}: the group did not form at {where} within --timeout {timeout_s:g}s "
              "(no peer there, or not a torch.distributed store: check MASTER_ADDR, MASTER_PORT and that "
              "every rank was started)")
    timer = threading.Timer(timeout_s, _give_up, args=(waited,))
    timer.daemon = True
    timer.start()
    try:
        yield
    except Exception as err:  # torch's DistNetworkError, DistStoreError, RuntimeError ...
        text = " ".join(str(err).split())
        if "EADDRINUSE" in text or "address already in use" in text.lower():
            raise DistributedRunError(f"rank {rank}: cannot host the group's store at {where}: the port is in use "
                                      "by another program (choose another MASTER_PORT)") from None
        if "timed out" in text.lower() or "timeout" in text.lower():
            raise DistributedRunError(waited) from None
        raise DistributedRunError(f"rank {rank}: could not join the group at {where}: {text[:300]}") from None
    finally:
        timer.cancel()


def _give_up(line: str) -> None:
    try:
        sys.stderr.write(f"pipesched: error: {line}\n")
        sys.stderr.flush()
    finally:
        os._exit(1)
