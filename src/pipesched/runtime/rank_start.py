"""How local ranks start: on Linux, forked from a server that imported torch once.

Every rank imports torch, ``torch.distributed`` and ``torch._dynamo`` (building any torch
optimizer imports it): seconds of CPU per process when each rank is a fresh interpreter
(multiprocessing's ``spawn``). multiprocessing's fork server imports them once, in a process
that has run nothing yet (no threads, no thread pools), and forks every rank from it: a rank
starts in a fraction of a second, and a launcher that starts ranks again (a profile, then the
run; a test session) reuses the server.

The server is a child of the launcher and the ranks are the server's children, so the lifeline
(:mod:`.lifeline`) runs through it: the server exits as soon as the launcher is gone (its end of
the server's "alive" pipe closes) and every rank dies with the server. A rank must therefore
close the copy of that pipe's write end it inherits (:func:`leave_the_server_to_the_launcher`),
or the server would live, and its ranks with it, as long as any rank does.

Elsewhere (macOS, Windows) ranks are spawned: their lifeline watches the launcher itself.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.forkserver as forkserver
import os
import sys
from multiprocessing.context import BaseContext

# what every rank needs before it runs anything (the server ignores a module it cannot import)
PRELOAD = ["torch", "torch.distributed", "torch._dynamo"]


def rank_context() -> tuple[BaseContext, int]:
    """The multiprocessing context that starts ranks, and the pid their parent will have
    (the fork server, started here if it is not running, or this process where ranks are spawned).

    Call it with SIGINT blocked: the server then starts, and stays, deaf to Ctrl-C (it would
    otherwise die of a Ctrl-C while it imports torch), and its ranks are born with SIGINT blocked.
    """
    if not sys.platform.startswith("linux"):
        return mp.get_context("spawn"), os.getpid()
    forkserver.set_forkserver_preload(PRELOAD)  # read when the server starts
    forkserver.ensure_running()
    return mp.get_context("forkserver"), forkserver._forkserver._forkserver_pid


def leave_the_server_to_the_launcher() -> None:
    """In a rank forked by the server: close this process's copy of the server's "alive" pipe,
    so that the server's life (and through it every rank's) ends with the launcher's."""
    server = forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
