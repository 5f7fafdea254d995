"""Writing output files safely: check the folder first, write a temporary file, then rename.

A failed or interrupted write never leaves a half-written file behind.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterable, Union

from .errors import ConfigError


def check_output_path(path: Union[str, Path], suffixes: Iterable[str]) -> Path:
    """Return ``path`` as a Path if a file with one of ``suffixes`` can be written there.

    Called before any work starts, so that a run is never lost to an output path found bad only
    at the end: the path must not be a folder nor any other file but a regular one, its folder must exist and accept new files (tried
    by creating and removing a temporary file there, as :func:`write_atomic` will).
    """
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"cannot write {str(path)!r}: it is a folder; name a file inside it")
    if path.exists() and not path.is_file():  # a FIFO would hang the first write, a device swallow it
        raise ConfigError(f"cannot write {str(path)!r}: it exists and is not a regular file (a FIFO, a device, a socket)")
    allowed = [s.lower() for s in suffixes]
    if path.suffix.lower() not in allowed:
        raise ConfigError(
            f"cannot write {str(path)!r}: the suffix must be one of {', '.join(allowed)}"
        )
    folder = _folder_of(path)
    if not folder.exists():
        raise ConfigError(f"cannot write {str(path)!r}: folder {str(folder)!r} does not exist")
    _check_accepts_files(folder, f"cannot write {str(path)!r}")
    return path


def check_output_folder(path: Union[str, Path]) -> Path:
    """Return ``path`` as a Path if it is, or can be made, a folder that accepts new files.

    A missing folder is not created here (that is the caller's first write); its nearest
    existing parent must accept new folders.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"cannot write into {str(path)!r}: it exists and is not a folder")
    existing = path
    while not existing.exists():
        existing = _folder_of(existing)
    _check_accepts_files(existing, f"cannot write into {str(path)!r}")
    return path


def _folder_of(path: Path) -> Path:
    return path.parent if str(path.parent) else Path(".")


def _check_accepts_files(folder: Path, failure: str) -> None:
    """Raise ConfigError(``failure``: why) unless ``folder`` is a folder that accepts new files.

    Trying is the only reliable test: permission bits do not bind root, and read-only or
    virtual file systems (/proc, /sys) refuse files whatever the bits say.
    """
    if not folder.is_dir():
        raise ConfigError(f"{failure}: {str(folder)!r} is not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".pipesched-probe.", dir=folder)
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ConfigError(f"{failure}: folder {str(folder)!r} does not accept new files ({reason})") from None
    os.close(fd)
    os.unlink(probe)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: Union[str, Path], data: Union[str, bytes]) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder, then rename."""
    path = Path(path)
    folder = _folder_of(path)
    if not folder.is_dir():
        raise ConfigError(f"cannot write {str(path)!r}: folder {str(folder)!r} does not exist")
    mode = "wb" if isinstance(data, bytes) else "w"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, mode, **({} if mode == "wb" else {"encoding": "utf-8", "newline": ""})) as fh:
            fh.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual file mode
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path
