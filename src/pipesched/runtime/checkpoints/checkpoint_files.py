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

import os
import re
import shutil
from pathlib import Path
from typing import Callable, Optional, Union

from ...errors import ConfigError
from .checkpoint_manifest import MANIFEST, STEP_DIR, check_step, write_manifest  # noqa: F401  (this module's API)
from .folder_lock import FolderLock

DEFAULT_KEEP = 2  # checkpoints kept: the newest two (one to fall back on if the newest is damaged)

PathLike = Union[str, Path]
PARTIAL_DIR = re.compile(r"^\.step-(\d+)\.partial$")
DAMAGED_SUFFIX = ".damaged"


class CheckpointUnreadable(ConfigError):
    """A checkpoint whose files cannot be read back (damaged, missing, truncated)."""


def complete_checkpoints(directory: PathLike) -> list[Path]:
    """Every ``step-NNNNNN`` folder of ``directory``, oldest first. A save writes into
    ``.step-NNNNNN.partial`` and gives the folder its step name only once it is complete, so a
    folder of that name is a finished step: listed whatever it holds now (its ``.metadata``
    missing, a FIFO, a folder or a link included), and damaged until :func:`check_step` says
    otherwise. Partial writes are never listed; nor is a link named like a step (not a step of
    this folder: it is never loaded or rotated away)."""
    folder = Path(directory)
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if STEP_DIR.match(p.name) and not p.is_symlink() and p.is_dir()]
    return sorted(found, key=lambda p: int(STEP_DIR.match(p.name).group(1)))


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


def rotate(directory: PathLike, keep: int, newest: Path) -> None:
    """Remove all but the ``keep`` newest checkpoints of ``directory``: never ``newest`` (just
    saved), nor a folder that one of those kept resolves to."""
    listed = complete_checkpoints(directory)
    kept = {os.path.realpath(p) for p in [*listed[-keep:], newest]}
    for old in listed[:-keep]:
        if os.path.realpath(old) not in kept:
            shutil.rmtree(old, ignore_errors=True)


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


def writable_folder(directory: PathLike) -> Path:
    """``directory``, created if it is not there; ConfigError (one line) where it is a file or
    cannot be written."""
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
    return folder


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
    folder = writable_folder(directory)
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
