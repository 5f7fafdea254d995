"""A checkpoint's manifest, written by us and read back as untrusted input.

``DIR/step-000012/manifest.json`` lists each file of the step (its size and SHA-256) and the step
it was saved after. Whatever is in the folder when it is read back may have been edited by hand,
copied from another step, or replaced by a link, a FIFO or a device, so reading it trusts
nothing: the manifest is a regular file of bounded size whose JSON has the expected shape; each
name it lists is a plain name inside the step folder (no ``/``, no ``..``, no NUL); each file is
opened without following links, must be a regular file, and is read for at most the bytes the
manifest says (a FIFO or ``/dev/zero`` cannot hang or grow the reading); the manifest's step is
the folder's. :func:`check_step` says, in a few words naming the file, what does not hold.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Optional, Union

MANIFEST = "manifest.json"
FORMAT = 1
STEP_DIR = re.compile(r"^step-(\d+)$")
MAX_MANIFEST_BYTES = 4 << 20  # a few files per rank, ~150 bytes each: room for over 20,000 ranks
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20
# opened without following a link, without waiting on a FIFO's writer
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


class Unreadable(Exception):
    """Why a file of a checkpoint cannot be trusted (a few words, naming the file)."""


def write_manifest(folder: Union[str, Path], step: int) -> Path:
    """Checksum every file of ``folder`` (a checkpoint DCP has finished) into its manifest,
    durably (written through a temporary file, then renamed and synced)."""
    folder = Path(folder)
    files = {}
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name != MANIFEST:
            size, digest = _read_regular(path, None)
            files[path.name] = {"bytes": size, "sha256": digest}
    tmp = folder / f".{MANIFEST}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"format": FORMAT, "step": step, "files": files}, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, folder / MANIFEST)
    return folder / MANIFEST


def read_manifest(folder: Path) -> tuple[int, dict[str, tuple[int, str]]]:
    """The step and the files (name -> (bytes, sha256)) ``folder``'s manifest lists; Unreadable
    saying why when it is missing, not a regular file, too large, or not of the expected shape."""
    path = folder / MANIFEST
    try:
        data = _read_bounded(path, MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        raise Unreadable(f"it has no {MANIFEST} (its save did not finish)") from None
    except Unreadable as why:
        raise Unreadable(f"its {MANIFEST} {why}") from None
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested beyond the parser's depth
        raise Unreadable(f"its {MANIFEST} is not JSON") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict) or not manifest["files"]:
        raise Unreadable(f"its {MANIFEST} lists no files")
    if manifest.get("format") != FORMAT:
        raise Unreadable(f"its {MANIFEST} is not of format {FORMAT}, the one this pipesched writes")
    step = manifest.get("step")
    if type(step) is not int or step < 0:
        raise Unreadable(f"its {MANIFEST} names no step")
    files = {}
    for name, entry in manifest["files"].items():
        if not _plain_name(name):
            raise Unreadable(f"its {MANIFEST} names {name[:60]!r}, not a plain file name inside the folder")
        size = entry.get("bytes") if isinstance(entry, dict) else None
        digest = entry.get("sha256") if isinstance(entry, dict) else None
        if type(size) is not int or size < 0 or not isinstance(digest, str) or not _SHA256.match(digest):
            raise Unreadable(f"its {MANIFEST} entry for {name!r} is not a byte count and a SHA-256")
        files[name] = (size, digest)
    return step, files


def _plain_name(name: str) -> bool:
    return name not in ("", ".", "..", MANIFEST) and not any(c in name for c in "/\\\0")


def check_step(folder: Union[str, Path]) -> Optional[str]:
    """Why checkpoint ``folder`` is not intact (naming the file), or None when it is the step its
    name says and every file matches its manifest."""
    folder = Path(folder)
    try:
        step, files = read_manifest(folder)
    except Unreadable as why:
        return str(why)
    except OSError as err:
        return f"its {MANIFEST} cannot be read ({err.strerror or type(err).__name__})"
    named = STEP_DIR.match(folder.name)
    if named and int(named.group(1)) != step:
        return (f"its {MANIFEST} is of step {step}, not {int(named.group(1))} "
                "(renamed, copied or linked from another step's folder)")
    for name, (size, digest) in sorted(files.items()):
        path = folder / name
        try:
            found = _read_regular(path, size)
        except Unreadable as why:
            return f"{path} {why}"
        except FileNotFoundError:
            return f"{path} is missing"
        except OSError as err:
            return f"{path} cannot be read ({err.strerror or type(err).__name__})"
        if found[0] != size:
            return f"{path} is {found[0]} bytes, its manifest says {size}"
        if found[1] != digest:
            return f"{path} does not match its checksum (damaged, or copied from another checkpoint)"
    extra = sorted(p.name for p in folder.iterdir() if p.name.endswith(".distcp") and p.name not in files)
    if extra:
        return f"{folder / extra[0]} is not in its manifest (copied in from another checkpoint?)"
    return None


def _open_regular(path: Path) -> tuple[int, int]:
    """``path`` opened for reading (fd, size), if it is a regular file and not a link."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise Unreadable("is a link, not a file") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise Unreadable("is not a regular file")
    return fd, info.st_size


def _read_regular(path: Path, expected: Optional[int]) -> tuple[int, str]:
    """The size and SHA-256 of regular file ``path``; with ``expected``, a file of another size
    is not read (its size is the answer)."""
    fd, size = _open_regular(path)
    try:
        if expected is not None and size != expected:
            return size, ""
        sha = hashlib.sha256()
        while block := os.read(fd, _CHUNK):
            sha.update(block)
        return size, sha.hexdigest()
    finally:
        os.close(fd)


def _read_bounded(path: Path, limit: int) -> bytes:
    fd, size = _open_regular(path)
    try:
        if size > limit:
            raise Unreadable(f"is {size} bytes, more than the {limit} a manifest may have")
        data = b""
        while block := os.read(fd, limit + 1 - len(data)):
            data += block
        return data
    finally:
        os.close(fd)
