"""Faults: a dead or silent rank makes the others fail fast, naming the rank and the action;
a non-finite loss stops the run before any weight changes (or skips the step when asked)."""

from __future__ import annotations

import multiprocessing
import time

import pytest

torch = pytest.importorskip("torch")

import pipesched  # noqa: E402
from pipesched.runtime.launch import FAILURE_GRACE_S, DistributedRunError, spawn  # noqa: E402
from runtime_cases import faulty_run, nonfinite_run  # noqa: E402

# pytest's timeouts and the bounds on how long a failed run takes include starting Python and torch
# in every rank, which a loaded machine can stretch to a minute: generous, well above the
# specified behaviour (a dead peer noticed at once, not after the timeout; a silent rank stopped
# after the timeout and the grace), which test_runtime_resume.py also bounds from the moment of
# the failure.
pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(600)]
STARTUP_ALLOWANCE_S = 90
RUN_TIMEOUT_S = 300.0  # where no wait is meant to time out: ranks start minutes apart on a loaded machine


def _failed_run(schedule_name: str, mode: str, timeout_s: float) -> tuple[str, float]:
    """Run the saboteur on 2 ranks; return the launcher's error message and the time it took."""
    schedule = pipesched.build_schedule(schedule_name, 2, 4)
    t0 = time.monotonic()
    with pytest.raises(DistributedRunError) as err:
        spawn(faulty_run, 2, (schedule, mode, timeout_s), timeout_s=timeout_s)
    assert not multiprocessing.active_children()
    return str(err.value), time.monotonic() - t0


def test_a_killed_rank_makes_the_others_fail_fast():
    message, elapsed = _failed_run("1f1b", "kill", RUN_TIMEOUT_S)
    assert "rank 1 died (killed by signal 9)" in message
    assert "rank 0 gave up waiting at" in message and "from rank 1" in message
    assert elapsed < STARTUP_ALLOWANCE_S + FAILURE_GRACE_S  # far below the timeout: noticed at once


def test_a_silent_rank_times_out_and_is_stopped():
    timeout_s = 5.0  # also bounds the ranks' rendezvous: more than a loaded machine's skew between them
    message, elapsed = _failed_run("zb-v", "hang", timeout_s)
    assert "rank 0 timed out" in message and "waiting at" in message and "from rank 1" in message
    assert "rank 1 was stopped" in message
    assert elapsed < STARTUP_ALLOWANCE_S + timeout_s + FAILURE_GRACE_S


def test_nonfinite_loss_names_step_and_microbatch_and_can_be_skipped():
    schedule = pipesched.build_schedule("zb-h1", 2, 4)
    with pytest.raises(DistributedRunError, match=r"step 1: the loss of microbatch 2 is (nan|inf)"):
        spawn(nonfinite_run, 2, (schedule, False), timeout_s=RUN_TIMEOUT_S)
    skipped, unchanged = spawn(nonfinite_run, 2, (schedule, True), timeout_s=RUN_TIMEOUT_S)[0]
    assert skipped and unchanged
