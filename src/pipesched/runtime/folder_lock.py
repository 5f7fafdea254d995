"""One run per checkpoint folder: a lock file naming the run that holds it.

``DIR/.pipesched-lock`` holds the holder's pid and host, and the holder keeps an exclusive
``flock`` on it for as long as it lives (the kernel drops it when the process dies, however it
dies). A second run is refused in one line naming the first's pid and host. A lock left by a
process that is gone (its flock released, or a pid no longer running on this host) is taken
over, and :class:`FolderLock` says so in ``took_over``. A lock naming another host cannot be
checked from here and is refused: remove the file once that run is known to be over.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import time
from pathlib import Path
from typing import Optional, Union

from ..errors import ConfigError

LOCK_FILE = ".pipesched-lock"

try:
    import fcntl
except ImportError:  # not POSIX: the pid and host alone say who holds it
    fcntl = None


_held: dict[str, "FolderLock"] = {}  # the locks this process holds, by their file's real path


class FolderInUse(ConfigError):
    """Another live run holds the checkpoint folder."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class FolderLock:
    """The lock of one folder, held by this process until :meth:`release` or its exit."""

    def __init__(self, folder: Union[str, Path]) -> None:
        self.path = Path(folder) / LOCK_FILE
        self.fd: Optional[int] = None
        self.took_over: Optional[str] = None  # "pid N on HOST": the dead holder whose lock we took

    def acquire(self) -> "FolderLock":
        """Take the lock (FolderInUse when a live run holds it); a lock this process already
        holds on the folder is shared (a second flock of it would refuse ourselves)."""
        key = os.path.realpath(self.path)
        if key in _held and _held[key].fd is not None:
            return _held[key]
        host = socket.gethostname()
        for _ in range(5):  # the holder may remove the file between our open and our flock
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = _read(fd)
                    os.close(fd)
                    raise FolderInUse(self._in_use(holder)) from None
                try:
                    same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
                except FileNotFoundError:
                    same = False
                if not same:
                    os.close(fd)
                    continue
            holder = _read(fd)
            if holder and holder.get("pid") != os.getpid():
                if holder.get("host") != host or (fcntl is None and _alive(int(holder.get("pid", 0)))):
                    os.close(fd)
                    raise FolderInUse(self._in_use(holder, checkable=holder.get("host") == host))
                self.took_over = f"pid {holder.get('pid')} on {holder.get('host')}"
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": host, "since": time.time()}).encode(), 0)
            os.fsync(fd)
            self.fd = fd
            _held[key] = self
            atexit.register(self.release)
            return self
        raise FolderInUse(f"{self.path.parent}: its lock file {self.path} keeps changing: another run is starting there")

    def _in_use(self, holder: Optional[dict], checkable: bool = True) -> str:
        who = f"pid {holder.get('pid')} on {holder.get('host')}" if holder else "another process"
        since = ""
        if holder and isinstance(holder.get("since"), (int, float)):
            since = time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(holder["since"]))
        advice = ("wait for it to end or choose another folder" if checkable else
                  f"if that run is over, remove {self.path}")
        return f"--checkpoint-dir {str(self.path.parent)!r} is in use by another run ({who}{since}): {advice}"

    def release(self) -> None:
        """Drop the lock and its file (idempotent)."""
        if self.fd is None:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None


def _read(fd: int) -> Optional[dict]:
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
        holder = json.loads(text) if text else None
        return holder if isinstance(holder, dict) else None
    except (OSError, ValueError):
        return None
