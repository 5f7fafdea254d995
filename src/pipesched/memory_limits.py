"""The memory limits, one meaning per flag in every command (issue 38): ``--memory-limit`` the
peak activations per rank in M_B, ``--activation-limit`` the same in bytes (where a command knows
the activation size), ``--rank-memory-limit`` all a rank holds in bytes (weights, gradients,
optimizer state and activations). Declared here once (no typer: the run's tree takes them too,
:mod:`pipesched.training.config.run_config`); every command takes these declarations.

A size given to ``--memory-limit`` (its old byte meanings) still works for one release, as the
flag its case now has, with a one-line warning (:func:`moved_size`).
"""

from __future__ import annotations

import math
import sys
from typing import Optional

from .declared import Declared
from .errors import ConfigError
from .memory import parse_size

MEMORY_LIMIT = Declared(
    "--memory-limit", None,
    "Peak activations per rank, in one microbatch's activations (M_B), e.g. 4; sizes in bytes are "
    "--activation-limit or --rank-memory-limit.",
)
ACTIVATION_LIMIT = Declared(
    "--activation-limit", None,
    "Peak activations per rank in bytes (40GiB, 512MiB), where the activation size is known: "
    "simulate --activation-bytes, advise --profile, train --schedule auto or zb-auto (which measure it).",
)
RANK_MEMORY_LIMIT = Declared(
    "--rank-memory-limit", None,
    "All a rank holds, in bytes (40GiB): weights, gradients, optimizer state and peak activations "
    "(advise with a model description; train with --dp-shard or --tp, also the gather window).",
)

MAX_LIMIT_MB = 1e9  # a limit above this many microbatches' activations is no limit at all
MAX_LIMIT_BYTES = 2.0**60  # 1 EiB per rank


def parse_memory_limit(text: Optional[str], flag: str = "--memory-limit") -> tuple[Optional[float], Optional[float]]:
    """A limit as typed, as (M_B units, bytes): a plain number is M_B, a size with a unit
    (``40GiB``, ``512MiB``) bytes; which of the two ``flag`` takes is its caller's to say."""
    if text is None:
        return None, None
    try:
        size = parse_size(text)
    except ValueError as err:
        raise ConfigError(f"{flag} {err}") from None
    value = size if size is not None else float(text)
    most = MAX_LIMIT_BYTES if size is not None else MAX_LIMIT_MB
    if not (math.isfinite(value) and 0 < value <= most):
        raise ConfigError(f"{flag} must be a finite number above 0, at most {most:g} "
                          f"{'bytes' if size is not None else 'M_B'}, got {text}")
    return (value, None) if size is None else (None, size)


def moved_size(command: str, text: str, new: str, new_value: Optional[str]) -> str:
    """``--memory-limit SIZE`` (the old spelling) as ``new`` (refused with ``new`` given too),
    saying so on stderr in one line."""
    if new_value is not None:
        raise ConfigError(f"--memory-limit {text} is the old spelling of {new} {text}: give {new} alone")
    print(f"pipesched: warning: {command} --memory-limit with a size is deprecated and goes in the next "
          f"release: use {new} {text} (--memory-limit takes M_B)", file=sys.stderr, flush=True)
    return text


def size_limit(flag: str, text: Optional[str]) -> Optional[float]:
    """``flag``'s size in bytes (None: not given); a plain number is refused, it would be M_B."""
    limit, size = parse_memory_limit(text, flag=flag)
    if limit is not None:
        raise ConfigError(f"{flag} {text}: give a size with a unit, e.g. 40GiB (--memory-limit takes M_B)")
    return size


def units_only(text: Optional[str], sized: str) -> Optional[float]:
    """``--memory-limit`` where no size is known: M_B, a size refused naming ``sized`` (where a
    size in bytes goes instead)."""
    limit, size = parse_memory_limit(text)
    if size is not None:
        raise ConfigError(f"--memory-limit {text}: --memory-limit takes M_B units (one microbatch's activations), "
                          f"e.g. --memory-limit 4{'; ' + sized if sized else ''}")
    return limit
