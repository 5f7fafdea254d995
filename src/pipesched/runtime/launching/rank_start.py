"""How local ranks start: forked from the launcher where that is safe, else spawned; and a word
when they outnumber the cores.

A spawned rank is a fresh interpreter: it imports torch (and transformers for a Hugging Face
model) and rebuilds what the launcher already built, 2-7 s of CPU per rank before its first
step (benchmarks/RESULTS.md, "Ranks forked from the launcher"). A forked rank starts with the
launcher's modules loaded and its per-process caches filled: the family's twin check
(:mod:`pipesched.hf.twin`), the tokenized data stream, the model's config. So on Linux, when
this process has not initialised CUDA (a forked child cannot use it; local ranks run on the CPU
anyway), ranks are forked: the pattern of torch's DataLoader workers, one compute thread each.

What a forked rank must not inherit is undone first thing (:func:`as_a_fresh_rank`): the
launcher's SIGTERM/SIGHUP handlers (which raise RunStopped in the launcher) go back to the
default; and tokenizers' thread pool, unusable after a fork, is told so before the fork
(``TOKENIZERS_PARALLELISM=false`` in the ranks' environment, unless the user set it), so that it
does not print a warning in every rank; and the launcher's objects are frozen out of the ranks'
garbage collections (:func:`forking_environment`). ``PIPESCHED_RANK_START=spawn`` spawns them instead.
A fork copies only the forking thread: a lock another thread of the launcher holds at that moment
stays held in the rank for ever. So no rank talks to the launcher's store (whose thread resolves
each peer's name under glibc's resolver lock) until every rank is started (``launch.spawn``'s
``started`` event).
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import signal
import sys
from contextlib import contextmanager
from typing import Iterator

import torch

from ...environment import local_cores
from ...errors import ConfigError

METHODS = ("fork", "spawn")
_warned = False  # the cores warning is said once per process


def start_method() -> str:
    """``fork`` on Linux when CUDA is not initialised here, else ``spawn``; ``PIPESCHED_RANK_START``
    (``fork`` or ``spawn``) overrides it where fork exists."""
    asked = os.environ.get("PIPESCHED_RANK_START")
    if asked not in (None, "", *METHODS):
        raise ConfigError(f"PIPESCHED_RANK_START={asked!r}: use one of {', '.join(METHODS)}")
    forkable = sys.platform.startswith("linux") and "fork" in mp.get_all_start_methods()
    if asked == "spawn" or not forkable:
        return "spawn"
    if asked == "fork":
        return "fork"
    return "spawn" if torch.cuda.is_initialized() else "fork"


@contextmanager
def forking_environment(method: str) -> Iterator[None]:
    """While ranks are forked: tokenizers' parallelism declared off in the environment they copy,
    and the launcher's objects frozen out of the garbage collector (``gc.freeze``: a rank's
    collections then never write to the pages it shares with the launcher, each write a page
    copied; Python's advice for fork without exec)."""
    if method != "fork":
        yield
        return
    told = "TOKENIZERS_PARALLELISM" not in os.environ
    if told:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        if told:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)


def as_a_fresh_rank() -> None:
    """In a rank: the default action for SIGTERM and SIGHUP (a forked rank inherits the launcher's
    handlers, which raise RunStopped instead of ending the process)."""
    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)


def warn_if_oversubscribed(world: int) -> None:
    """One line on stderr, once per process, when ``world`` local ranks outnumber the cores."""
    global _warned
    cores = local_cores()
    if world <= cores or _warned:
        return
    _warned = True
    print(f"pipesched: {world} ranks on {cores} core{'s' if cores > 1 else ''}: steps run slower, as the ranks take turns on the cores "
          "(step times and the measured bubble include the waiting)", file=sys.stderr, flush=True)
