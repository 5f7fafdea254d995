"""One run per checkpoint folder: a lock file naming the run that holds it.

``DIR/.pipesched-lock`` holds the holder's pid and host, and the holder keeps an exclusive
``flock`` on it for as long as it lives (the kernel drops it when the process dies, however it
dies). A second run is refused in one line naming the first's pid and host. A lock left by a
process that is gone (its flock released, or a pid no longer running on this host) is taken
over, and :class:`FolderLock` says so in ``took_over``. A lock naming another host cannot be
checked from here and is refused: remove the file once that run is known to be over. The file
is opened without following links and only as a regular file: a link, a folder or a FIFO at its
name is refused in one line, and nothing outside the folder is ever written.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import stat
import time
from pathlib import Path
from typing import Optional, Union

from ...errors import ConfigError

LOCK_FILE = ".pipesched-lock"
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)

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
            fd = self._open()
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = _read(fd)
                    os.close(fd)
                    raise FolderInUse(self._in_use(holder)) from None
                try:
                    same = os.fstat(fd).st_ino == os.lstat(self.path).st_ino
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

    def _open(self) -> int:
        """The lock file, opened (created) without following a link and only as a regular file:
        a link or a FIFO put there would make our writes land outside the folder, or wait."""
        try:
            fd = os.open(self.path, _LOCK_FLAGS, 0o644)
        except OSError as err:
            check_lock_file(self.path.parent)  # a link, a folder: said as such
            raise _unusable(self.path, f"cannot be opened ({err.strerror or type(err).__name__})") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise _unusable(self.path, "is not a regular file")
        return fd

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


def check_lock_file(folder: Union[str, Path]) -> None:
    """Refuse a ``folder`` whose lock file's name holds a link, a folder, a FIFO or a device
    (checked again when the lock is taken; this answers before a run imports torch)."""
    path = Path(folder) / LOCK_FILE
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return
    if stat.S_ISLNK(mode):
        raise _unusable(path, "is a link")
    if not stat.S_ISREG(mode):
        raise _unusable(path, "is not a regular file")


def _unusable(path: Path, why: str) -> ConfigError:
    return ConfigError(f"--checkpoint-dir {str(path.parent)!r}: its lock file {path} {why}: "
                       "remove it if no run uses the folder")


def _read(fd: int) -> Optional[dict]:
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
        holder = json.loads(text) if text else None
        return holder if isinstance(holder, dict) else None
    except (OSError, ValueError):
        return None
