"""A checkpoint folder on disk: its step folders, their checksum manifests and verification,
stale partial writes, and preparing (locking, choosing what to resume from) a run's folder.

Pure Python (no torch), so ``pipesched checkpoint verify`` answers without importing it.

Every complete checkpoint ``DIR/step-000012`` holds ``manifest.json``: the size and SHA-256 of
each file DCP wrote there (every rank's ``.distcp`` and ``.metadata``), computed by the
coordinator once every rank's file is complete and before the folder gets its final name. A
flipped byte, a truncated or empty file, a missing one, or a rank file copied from another step
then no longer matches, and :func:`check_step` names the file. A checkpoint without a manifest
(interrupted before it was written, or saved by an older pipesched) is not intact: resuming
falls back past it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Callable, Optional, Union

from ..errors import ConfigError
from .folder_lock import FolderLock

PathLike = Union[str, Path]
STEP_DIR = re.compile(r"^step-(\d+)$")
PARTIAL_DIR = re.compile(r"^\.step-(\d+)\.partial$")
MANIFEST = "manifest.json"
DAMAGED_SUFFIX = ".damaged"
_CHUNK = 1 << 20


class CheckpointUnreadable(ConfigError):
    """A checkpoint whose files cannot be read back (damaged, missing, truncated)."""


def complete_checkpoints(directory: PathLike) -> list[Path]:
    """Every ``step-NNNNNN`` folder that DCP finished (it has ``.metadata``), oldest first
    (partial writes are never listed; damaged ones are, until verified)."""
    folder = Path(directory)
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if STEP_DIR.match(p.name) and (p / ".metadata").is_file()]
    return sorted(found, key=lambda p: int(STEP_DIR.match(p.name).group(1)))


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_CHUNK), b""):
            sha.update(block)
    return sha.hexdigest()


def write_manifest(folder: PathLike, step: int) -> Path:
    """Checksum every file of ``folder`` (a checkpoint DCP has finished) into its manifest,
    durably (written through a temporary file, then renamed and synced)."""
    folder = Path(folder)
    files = {p.name: {"bytes": p.stat().st_size, "sha256": _digest(p)}
             for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}
    tmp = folder / f".{MANIFEST}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"format": 1, "step": step, "files": files}, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, folder / MANIFEST)
    return folder / MANIFEST


def check_step(folder: PathLike) -> Optional[str]:
    """Why checkpoint ``folder`` is not intact (naming the file), or None when every file
    matches its manifest."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        files = manifest["files"]
        assert isinstance(files, dict) and files
    except FileNotFoundError:
        return f"it has no {MANIFEST} (its save did not finish)"
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        return f"its {MANIFEST} is unreadable"
    for name, want in sorted(files.items()):
        path = folder / name
        try:
            size = path.stat().st_size
            if size != want.get("bytes"):
                return f"{path} is {size} bytes, its manifest says {want.get('bytes')}"
            if _digest(path) != want.get("sha256"):
                return f"{path} does not match its checksum (damaged, or copied from another checkpoint)"
        except FileNotFoundError:
            return f"{path} is missing"
        except OSError as err:
            return f"{path} cannot be read ({err.strerror or type(err).__name__})"
    extra = sorted(p.name for p in folder.iterdir() if p.name.endswith(".distcp") and p.name not in files)
    if extra:
        return f"{folder / extra[0]} is not in its manifest (copied in from another checkpoint?)"
    return None


def newest_intact(directory: PathLike) -> tuple[Optional[Path], list[tuple[Path, str]]]:
    """The newest checkpoint of ``directory`` whose files match their manifest, and the newer
    ones that do not, newest first, each with why."""
    damaged = []
    for folder in reversed(complete_checkpoints(directory)):
        problem = check_step(folder)
        if problem is None:
            return folder, damaged
        damaged.append((folder, problem))
    return None, damaged


def set_aside(folder: Path) -> Path:
    """Rename a damaged checkpoint ``step-N`` to ``step-N.damaged`` (kept for inspection, never
    listed, loaded or rotated away); a second one of that step gets ``.damaged-2``, and so on."""
    target = folder.with_name(folder.name + DAMAGED_SUFFIX)
    n = 1
    while target.exists():
        n += 1
        target = folder.with_name(f"{folder.name}{DAMAGED_SUFFIX}-{n}")
    os.rename(folder, target)
    return target


def remove_partials(directory: PathLike) -> list[Path]:
    """Remove the ``.step-N.partial`` folders that interrupted saves left; returns those removed.
    Only the run holding the folder's lock may call it."""
    folder = Path(directory)
    if not folder.is_dir():
        return []
    stale = [p for p in folder.iterdir() if PARTIAL_DIR.match(p.name)]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


# -- a run's folder ---------------------------------------------------------------------


def step_dir(directory: PathLike, step: int) -> Path:
    return Path(directory) / f"step-{step:06d}"


def checkpoint_step(path: PathLike) -> int:
    """The step a checkpoint folder was saved after (its name says it)."""
    match = STEP_DIR.match(Path(path).name)
    if not match:
        raise ConfigError(f"{str(path)!r} is not a checkpoint folder (step-NNNNNN)")
    return int(match.group(1))


def latest(directory: PathLike) -> Optional[Path]:
    """The newest complete checkpoint in ``directory``, or None."""
    found = complete_checkpoints(directory)
    return found[-1] if found else None


def prepare_directory(directory: PathLike, resume: bool, say: Callable[[str], None] = lambda _: None,
                      owner: bool = True, check: Optional[Callable[[Path], None]] = None) -> Optional[Path]:
    """Check ``directory`` before a run starts (ConfigError: one line) and create it; return the
    checkpoint to resume from (with ``resume``: the newest intact one), else None. ``check``
    may refuse that checkpoint (another model, nothing left to do). Only then, as the folder's
    ``owner`` (the one process of the run that writes there), lock it for this process's life,
    remove the partial folders of interrupted saves and set aside the damaged checkpoints newer
    than the one chosen: a run refused for its options never holds the lock, nor changes the
    folder. ``say`` gets a line for each thing done that the user should know.

    Starting afresh in a folder that already holds checkpoints is refused: the new run's would
    mix with the old run's, and ``--resume`` would then pick from both."""
    folder = Path(directory)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--checkpoint-dir {str(folder)!r} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".pipesched-write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as err:
        raise ConfigError(f"--checkpoint-dir {str(folder)!r}: cannot write there ({err.strerror})") from None
    newest = latest(folder)
    if resume and newest is None:
        raise ConfigError(f"--resume: no complete checkpoint in {str(folder)!r} (step-NNNNNN folders)")
    if not resume and newest is not None:
        raise ConfigError(
            f"--checkpoint-dir {str(folder)!r} already holds checkpoints (newest {newest.name}): "
            "add --resume to continue that run, or choose an empty folder"
        )
    intact, damaged = newest_intact(folder) if resume else (None, [])
    if resume and intact is None:
        why = "; ".join(f"{p.name}: {problem}" for p, problem in damaged)
        raise CheckpointUnreadable(f"--resume: no intact checkpoint in {str(folder)!r}: {why}")
    if intact is not None and check is not None:
        check(intact)
    if not owner:
        return intact
    lock = FolderLock(folder).acquire()
    if lock.took_over:
        say(f"took over the lock of {folder} from {lock.took_over}, which is no longer running")
    stale = remove_partials(folder)
    if stale:
        say(f"removed {', '.join(p.name for p in stale)} in {folder} (left by an interrupted save)")
    for path, problem in damaged:
        say(f"{path.name} is damaged: {problem}; set aside as {set_aside(path).name}, resuming from "
            f"{intact.name}, the newest intact checkpoint")
    return intact
