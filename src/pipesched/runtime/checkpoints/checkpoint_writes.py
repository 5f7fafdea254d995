"""Why a checkpoint's save or load failed, in a few words, with the operating system's own cause.

DCP writes each rank's file with ``torch.save`` into a Python stream. When a write of that stream
fails (a full disk: ``OSError(ENOSPC)``), torch's C++ writer does not pass the error on: it
raises ``[enforce fail at inline_container.cc:...] unexpected pos``, which names no cause. The
streams :func:`writer` hands DCP remember the first ``OSError`` a write raised in this process,
and :func:`reason` names it ("No space left on device (FILE)") in place of torch's words.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Optional, Union

_first_write_error: list[OSError] = []  # this process's, since its last writer()


class _Watched:
    """A stream whose failed writes are remembered (every other call goes to the stream)."""

    def __init__(self, stream, path) -> None:
        self._stream, self._path = stream, path

    def write(self, data) -> int:
        try:
            return self._stream.write(data)
        except OSError as err:
            if not _first_write_error:
                err.filename = err.filename or str(self._path)
                _first_write_error.append(err)
            raise

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def writer(path: Union[str, Path]):
    """DCP's file-system writer for checkpoint folder ``path``, its streams watched."""
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.filesystem import FileSystem

    class WatchedFileSystem(FileSystem):
        @contextmanager
        def create_stream(self, file, mode):
            with super().create_stream(file, mode) as stream:
                yield _Watched(stream, file) if "w" in mode else stream

    _first_write_error.clear()
    storage = FileSystemWriter(str(path))
    storage.fs = WatchedFileSystem()
    return storage


def reason(err: BaseException) -> str:
    """Why a DCP call failed, in a few words: the first failure of any rank (DCP's
    CheckpointException gathers every rank's), as its OS error (the one a write raised, where
    torch's writer hid it) or its first line."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict) and failures:
        err = next(iter(failures.values()))[0]
    cause: Optional[BaseException] = err if isinstance(err, OSError) and err.strerror else None
    if cause is None and _first_write_error:
        cause = _first_write_error[0]
    if cause is not None:
        return cause.strerror + (f" ({cause.filename})" if cause.filename else "")
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
