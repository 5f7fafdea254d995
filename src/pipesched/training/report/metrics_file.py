"""A ``--metrics`` file read back, as untrusted input, and continued after ``--resume``.

Whatever ``pipesched report --run FILE`` is given may be anything: a FIFO, a device, a file
edited by hand. So the file must be a regular file (opened without waiting on a FIFO's writer),
is read for at most :data:`MAX_BYTES`, and every field the report reads is checked for its type
and range, a refusal naming the line and the field (:func:`read_metrics`).

A resumed run continues its file (:func:`continue_after`): the lines the interrupted run wrote
after the checkpoint's step move to a side file named after that step
(``metrics.jsonl.after-step-20``), so the file holds each step once, in order, and its elapsed
time continues from the line of the checkpoint's step. A fresh run (no ``--resume``) starts the
file afresh (:func:`set_aside_earlier`): an earlier run's lines move to a side file
(``metrics.jsonl.earlier-run-1``, the first number free), so two runs never mix in one file and
nothing is lost.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Optional

from ...errors import ConfigError

MAX_BYTES = 256 << 20  # ~500 bytes a line: over 500,000 logging intervals
NEEDED = ("step", "loss", "lr", "tokens_per_s", "step_time_s", "peak_memory_bytes")
MAX_RANKS = 1 << 16  # the report draws a curve a rank: a bounded page
MAX_STEP = 2**53  # a step count a float holds exactly (the charts plot steps as floats)
# the numbers the report reads, each (field, may be null): a skipped step's loss and an
# overflowing perplexity are written as null (metrics.py)
NUMBERS = (("loss", True), ("lr", False), ("tokens_per_s", False), ("step_time_s", False), ("elapsed_s", False),
           ("eval_loss", False), ("eval_perplexity", True), ("mfu", False), ("bubble_share", False),
           ("simulated_bubble_share", False))
# fields the report reads as one: all of a group, or none
TOGETHER = (("eval_step", "eval_loss", "eval_perplexity"), ("bubble_share", "simulated_bubble_share"))
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)  # a FIFO opens at once instead of waiting for a writer


def read_metrics(path: Path, flag: str = "--run", cut_short: bool = False) -> list[dict]:
    """The logging intervals of a ``--metrics`` file (ConfigError, one line, for what is not one).
    ``cut_short``: the file of a run that may have been killed while writing its last line (one
    with no newline yet): that line is left out."""
    where = f"{flag} {str(path)!r}"
    text = _read_bounded(path, where)
    if cut_short and not text.endswith("\n"):
        text = text[:text.rfind("\n") + 1]
    lines = text.split("\n")  # JSON lines end at "\n" only (str.splitlines would also split at U+2028 in a string)
    rows = []
    for number, line in enumerate(lines[:-1] if lines[-1] == "" else lines, 1):
        rows.append(_checked_row(line, f"{where}: line {number}"))
    if not rows:
        raise ConfigError(f"{where}: no metrics lines (pipesched train --metrics writes them)")
    return rows


def _read_bounded(path: Path, where: str) -> str:
    """The text of regular file ``path``, at most :data:`MAX_BYTES` of it."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as err:
        raise ConfigError(f"{where}: {err.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{where}: not a regular file (a metrics file of pipesched train is one)")
        data = bytearray()
        while info.st_size <= MAX_BYTES and len(data) <= MAX_BYTES:  # bounded, should the file grow meanwhile
            chunk = os.read(fd, min(1 << 20, MAX_BYTES + 1 - len(data)))
            if not chunk:
                break
            data += chunk
    except OSError as err:
        raise ConfigError(f"{where}: {err.strerror}") from None
    finally:
        os.close(fd)
    if max(info.st_size, len(data)) > MAX_BYTES:
        raise ConfigError(f"{where}: larger than {MAX_BYTES >> 20} MiB, more than a metrics file of pipesched train holds")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not a text file") from None


def _checked_row(line: str, where: str) -> dict:
    """One line as a metrics row, each field the report reads checked."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{where} is not JSON ({err.msg})") from None
    except (RecursionError, ValueError):  # nested beyond the parser's depth; an integer of over 4300 digits
        raise ConfigError(f"{where} is not a metrics line of pipesched train (nested or sized beyond one)") from None
    missing = [k for k in NEEDED if not isinstance(row, dict) or k not in row]
    if missing:
        raise ConfigError(f"{where} is not a metrics line of pipesched train (no {', '.join(missing)})")
    for name in ("step", "eval_step"):
        if name in row and not _whole(row[name], 1, MAX_STEP):
            raise ConfigError(f"{where}: {name} must be a whole number from 1 to {MAX_STEP}, got {_shown(row[name])}")
    for name, nullable in NUMBERS:
        if name in row and not (row[name] is None and nullable) and not _finite(row[name]):
            raise ConfigError(f"{where}: {name} must be a finite number{' or null' if nullable else ''}, "
                              f"got {_shown(row[name])}")
    for together in TOGETHER:
        present = [name for name in together if name in row]
        if present and len(present) < len(together):
            raise ConfigError(f"{where}: {', '.join(together)} go together (only {', '.join(present)} given)")
    peaks = row["peak_memory_bytes"]
    if not isinstance(peaks, list) or len(peaks) > MAX_RANKS or not all(_whole(p, 0, 2**63) for p in peaks):
        raise ConfigError(f"{where}: peak_memory_bytes must be a list of at most {MAX_RANKS} whole numbers of bytes "
                          f"(one a rank), got {_shown(peaks)}")
    return row


def _finite(value) -> bool:
    """A JSON number a float holds, finite (an integer of 400 digits is not: it overflows one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _whole(value, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _shown(value) -> str:
    """A field's value in a few characters (whatever its size or depth)."""
    if isinstance(value, (dict, list)):
        return "a JSON " + ("object" if isinstance(value, dict) else "list")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**12:
        return f"an integer of {len(str(abs(value)))} digits"
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def side_file(path: Path, step: int) -> Path:
    """Where the lines an interrupted run wrote after step ``step`` are kept once it resumes."""
    return path.with_name(f"{path.name}.after-step-{step}")


def set_aside_earlier(path: Path) -> Optional[Path]:
    """Move what an earlier run wrote to ``path`` (a fresh run's metrics file) to
    ``FILE.earlier-run-N``, N the first number not taken, and return it (None when ``path`` is
    missing or empty: nothing to keep). Renamed, not copied: the lines stay as they were."""
    try:
        if path.stat().st_size == 0:
            return None
    except OSError:
        return None
    number = 1
    while (kept := path.with_name(f"{path.name}.earlier-run-{number}")).exists() or kept.is_symlink():
        number += 1
    os.rename(path, kept)
    return kept


def continue_after(path: Path, step: int) -> tuple[float, Optional[Path]]:
    """Make ``path`` (a run's metrics file, if any) end at step ``step``, the checkpoint a run
    resumes from: the lines after it move to :func:`side_file` (None when there were none), and
    so does a line it cannot read (the last one of a run killed while writing it, say). Returns
    the elapsed seconds of the run at its last kept line (0 without one), which the resumed run's
    elapsed time continues from."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    except (OSError, UnicodeDecodeError):
        return 0.0, None
    kept, after, elapsed = [], [], 0.0
    for line in lines:
        row = _row_or_none(line)
        later = row is None or row["step"] > step
        (after if later else kept).append(line if line.endswith("\n") else line + "\n")
        if row is not None and not later and _finite(row.get("elapsed_s")):
            elapsed = float(row["elapsed_s"])
    if not after:
        return elapsed, None
    moved = side_file(path, step)
    with open(moved, "a", encoding="utf-8") as kept_aside:  # a second resume from the same step adds to it
        kept_aside.write("".join(after))
    from ...outfiles import write_atomic

    write_atomic(path, "".join(kept))
    return elapsed, moved


def _row_or_none(line: str) -> Optional[dict]:
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return row if isinstance(row, dict) and _whole(row.get("step"), 0, MAX_STEP) else None
