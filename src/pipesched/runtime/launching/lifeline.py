"""Locally spawned ranks never outlive their launcher, whatever ends it.

A launcher killed by SIGKILL, or hung up on (a closed terminal, a dropped ssh session), runs no
cleanup code, so its ranks must notice by themselves. On Linux the kernel does it: the rank asks
for SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``), then checks that the parent did
not die before the request took effect. Elsewhere a watchdog thread waits on the launcher's
process sentinel (which becomes ready when the launcher is gone) and kills the rank.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int) -> str:
    """Make this process die as soon as process ``parent_pid`` (its launcher) does; returns how
    ("pdeathsig" or "watchdog"). Call it first thing in a spawned rank."""
    if sys.platform.startswith("linux") and _ask_kernel():
        how = "pdeathsig"
    else:
        _start_watchdog()
        how = "watchdog"
    if os.getppid() != parent_pid:  # the launcher died before we could ask
        os._exit(1)
    return how


def _ask_kernel() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _start_watchdog() -> None:
    parent = multiprocessing.parent_process()
    if parent is None or parent.sentinel is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="pipesched-launcher-watchdog", daemon=True).start()
