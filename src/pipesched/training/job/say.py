"""The job's lines for its user: on stderr (notes, warnings, refusals) or stdout (what it wrote),
flushed at once so they keep their order with the ranks' own lines, and never failing the run
when the terminal that would show them is gone (after SIGHUP)."""

from __future__ import annotations

import sys


def say(line: str) -> None:
    """One line on stderr."""
    _write(line, sys.stderr)


def tell(line: str) -> None:
    """One line on stdout."""
    _write(line, sys.stdout)


def _write(line: str, stream) -> None:
    try:
        print(line, file=stream, flush=True)
    except OSError:
        pass

