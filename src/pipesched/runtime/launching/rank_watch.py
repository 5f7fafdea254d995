"""Watch the locally spawned ranks: gather their results, name a failure in one line, stop the rest.

After the first failure the others get a short grace to report why they stopped (a dead peer
makes their receives fail at once), then they are stopped: one second when the failure was the
rank's own (a misuse, a full disk), which the others only echo; at once when those left are
stopped by a signal and cannot answer. Bad input the ranks refused (pipesched's own errors, raised
on a rank), with nothing else failing of its own, is :class:`RanksRefused`, a ConfigError (the CLI's
exit 2); any other failure a :class:`DistributedRunError` (exit 1). :mod:`.launch` starts the ranks
and calls :func:`collect`.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import time
from pathlib import Path
from typing import Any, Optional

from ...errors import ConfigError, RunFailure


class DistributedRunError(RunFailure):
    """One or more ranks failed; the message names each rank and why."""


class RanksRefused(ConfigError):
    """Ranks refused the run as bad input (a :class:`~pipesched.errors.PipeschedError` raised on a
    rank, e.g. a tensor-parallel plan that leaves gradients partial), and nothing else failed of its
    own: the CLI says it in one line and exits 2, as for bad input refused before the ranks start."""


FAILURE_GRACE_S = 10.0  # after a rank fails, how long the others get to say why they stopped
CAUSE_GRACE_S = 1.0  # ... when it failed of its own cause: the others only wait for it


def collect(procs: list, results, timeout_s: float) -> dict[int, Any]:
    """Gather every rank's result; after the first failure, give the others a short grace to
    report why they stopped (a dead peer makes their receives fail at once), then stop them.
    A failure of a rank's own (a misuse, a full disk: not a peer's silence) gets them one
    second; ranks that cannot answer (stopped by SIGSTOP) none. A single rank silent for
    ``timeout_s`` since it last reported progress is stopped at once."""
    world = len(procs)
    done: dict[int, Any] = {}
    errors: dict[int, str] = {}
    causes: set[int] = set()  # ranks whose failure is their own
    refused: set[int] = set()  # ... of which those that refused bad input
    lost: set[int] = set()  # ranks that died or went silent
    echoes: set[int] = set()  # ranks that reported a peer's failure (gone, silent)
    heard: dict[int, float] = {}  # when each rank last reported progress
    failed_at: Optional[float] = None
    while len(done) + len(errors) < world:
        _drain(results, done, errors, causes, echoes, heard, refused, wait=0.1)
        if world == 1 and 0 in heard and not done and not errors and time.monotonic() - heard[0] > timeout_s:
            errors[0] = f"rank 0 timed out after {timeout_s:g}s without progress (it has no peer to wait for) and was stopped"
            lost.add(0)
        for rank, p in enumerate(procs):
            if rank not in done and rank not in errors and p.exitcode is not None:
                _drain(results, done, errors, causes, echoes, heard, refused, wait=0.2)
                if rank not in done and rank not in errors:
                    errors[rank] = f"rank {rank} died ({_exit_text(p.exitcode)})"
                    lost.add(rank)
        if errors and failed_at is None:
            failed_at = time.monotonic()
        if failed_at is None:
            continue
        waiting = [r for r in range(world) if r not in done and r not in errors]
        grace = min(timeout_s, CAUSE_GRACE_S if causes else FAILURE_GRACE_S)
        if time.monotonic() - failed_at > grace or all(_not_running(procs[r].pid) for r in waiting):
            for rank in waiting:
                why = " (it was not running: stopped by a signal)" if _not_running(procs[rank].pid) else ""
                errors[rank] = f"rank {rank} was stopped after the failure{why}"
    if causes:  # the others' reports only echo it ("Connection closed by peer")
        for rank in echoes:
            errors[rank] = f"rank {rank} was stopped after the failure"
    if errors:
        only_refused = refused and causes == refused and not lost  # the others only echo it or were stopped
        raise (RanksRefused if only_refused else DistributedRunError)(_failure_text(errors))
    return {rank: pickle.loads(blob) for rank, blob in done.items()}


def _not_running(pid: Optional[int]) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, SIGTSTP) and so cannot report (Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] in ("T", "t")


def _failure_text(errors: dict[int, str]) -> str:
    """One line: deaths first, then each distinct reason once (with the ranks that gave it)."""
    by_text: dict[str, list[int]] = {}
    for rank, text in sorted(errors.items()):
        by_text.setdefault(text, []).append(rank)
    parts = []
    for text, ranks in sorted(by_text.items(), key=lambda kv: ("stopped" in kv[0], "died" not in kv[0], kv[1])):
        if text.startswith("rank"):
            parts.append(text)
        else:
            parts.append(f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {text}")
    return "; ".join(parts)


def _drain(results, done: dict, errors: dict, causes: set, echoes: set, heard: dict, refused: set,
           wait: float) -> None:
    try:
        kind, rank, value = results.get(timeout=wait)
    except queue.Empty:
        return
    while True:
        if kind == "alive":
            heard[rank] = time.monotonic()
        else:
            (done if kind == "ok" else errors)[rank] = value
            if kind != "ok":
                (echoes if kind == "error" else causes).add(rank)
                if kind == "refused":
                    refused.add(rank)
        try:
            kind, rank, value = results.get_nowait()
        except queue.Empty:
            return


def _exit_text(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


def stop(procs: list) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
            if _not_running(p.pid):  # a stopped process acts on SIGTERM only once continued
                os.kill(p.pid, signal.SIGCONT)
    deadline = time.monotonic() + 5
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
