"""The environment variables ``pipesched train`` reads, checked before any rank starts.

A torchrun rank is told who it is by ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``
(and ``LOCAL_RANK``); all of them or none must be set. Some of them left exported in a shell
would otherwise make ``pipesched train`` wait as one rank of a world that never comes, then fail
with a traceback. ``PIPESCHED_BACKEND`` picks torch.distributed's backend under torchrun (gloo or
nccl; local ranks always use gloo). A value that is wrong is one line, exit 2 (ConfigError).
Pure Python: no torch import (whether CUDA is there is the caller's to say).
"""

from __future__ import annotations

import os
from typing import Mapping, NamedTuple, Optional

from .errors import ConfigError

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
BACKENDS = ("gloo", "nccl")
SHOWN = 40  # characters of a variable's value quoted in a message


class TorchrunRank(NamedTuple):
    """Who this process is under torchrun."""

    rank: int
    world: int
    local_rank: int


def physical_memory() -> Optional[int]:
    """Bytes of RAM on this machine, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def local_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system has one): what local
    ranks share (the launcher's warning, ``train``'s bound on the processes it starts here)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def torchrun_rank(environ: Mapping[str, str] = os.environ) -> Optional[TorchrunRank]:
    """This process's place under torchrun; None when neither ``RANK`` nor ``WORLD_SIZE`` is set.

    Raises ConfigError when only some are set, or one is not what torchrun writes (a rank
    outside 0..WORLD_SIZE-1, a port outside 1..65535, a number that is not one)."""
    present = [name for name in TORCHRUN_VARIABLES if name in environ]
    if "RANK" not in environ and "WORLD_SIZE" not in environ:
        return None  # MASTER_ADDR/MASTER_PORT alone name no rank (pipesched's own local ranks set them)
    missing = [name for name in TORCHRUN_VARIABLES if name not in environ]
    if missing:
        raise ConfigError(
            f"the environment sets {', '.join(present)} but not {', '.join(missing)}: torchrun sets all of "
            f"them; to start local ranks instead, unset them (unset {' '.join(present)})"
        )
    world = _whole(environ, "WORLD_SIZE", 1, 2**20)
    rank = _whole(environ, "RANK", 0, world - 1)
    _whole(environ, "MASTER_PORT", 1, 65535)
    if not environ["MASTER_ADDR"].strip():
        raise ConfigError("MASTER_ADDR is empty: torchrun sets it to rank 0's host")
    local = _whole(environ, "LOCAL_RANK", 0, world - 1) if "LOCAL_RANK" in environ else 0
    return TorchrunRank(rank, world, local)


def backend(environ: Mapping[str, str] = os.environ, *, cuda: bool) -> str:
    """torch.distributed's backend for a torchrun rank: ``PIPESCHED_BACKEND`` if set (checked:
    gloo, or nccl where ``cuda`` says CUDA GPUs are there), else nccl with CUDA, gloo without."""
    chosen = environ.get("PIPESCHED_BACKEND", "").strip().lower()
    if not chosen:
        return "nccl" if cuda else "gloo"
    if chosen not in BACKENDS:
        raise ConfigError(f"PIPESCHED_BACKEND={_shown(environ['PIPESCHED_BACKEND'])} is not known: use {' or '.join(BACKENDS)}")
    if chosen == "nccl" and not cuda:
        raise ConfigError("PIPESCHED_BACKEND=nccl needs CUDA GPUs, but this torch sees none (a CPU build, "
                          "or no GPU visible): use PIPESCHED_BACKEND=gloo or unset it")
    return chosen


def _whole(environ: Mapping[str, str], name: str, low: int, high: int) -> int:
    text = environ[name].strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 9 and low <= int(text) <= high):
        raise ConfigError(f"{name}={_shown(environ[name])} is not what torchrun sets: expected a whole number from {low} to {high}")
    return int(text)


def _shown(value: str) -> str:
    return repr(value if len(value) <= SHOWN else value[:SHOWN] + "...")
