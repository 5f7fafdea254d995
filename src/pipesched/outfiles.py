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
    """Return ``path`` as a Path if its folder exists and its suffix is one of ``suffixes``."""
    path = Path(path)
    allowed = [s.lower() for s in suffixes]
    if path.suffix.lower() not in allowed:
        raise ConfigError(
            f"cannot write {str(path)!r}: the suffix must be one of {', '.join(allowed)}"
        )
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ConfigError(f"cannot write {str(path)!r}: folder {str(folder)!r} does not exist")
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: Union[str, Path], data: Union[str, bytes]) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder, then rename."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
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
