"""Faults: a dead or silent rank makes the others fail fast, naming the rank and the action;
a non-finite loss stops the run before any weight changes (or skips the step when asked)."""

from __future__ import annotations

import multiprocessing
import re
import time

import pytest

torch = pytest.importorskip("torch")

from runtime_cases import faulty_run, nonfinite_run  # noqa: E402

import pipesched  # noqa: E402
from pipesched.runtime.launching.launch import (  # noqa: E402
    FAILURE_GRACE_S,
    DistributedRunError,
    spawn,
)

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


def test_a_rank_failing_of_its_own_cause_stops_the_others_within_a_second_with_its_reason(tmp_path, monkeypatch):
    raised_at = tmp_path / "raised_at"
    monkeypatch.setenv("PIPESCHED_TEST_RAISED_AT", str(raised_at))
    message, _ = _failed_run("1f1b", "raise", RUN_TIMEOUT_S)
    assert time.time() - float(raised_at.read_text()) < 1 + 1  # and the launcher's own exit
    # rank 0's "Connection closed by peer" only echoes it
    assert re.fullmatch(r"rank 1: RuntimeError: a bug in rank 1's block \(runtime_cases.py:\d+\); "
                        "rank 0 was stopped after the failure", message), message


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


def test_ranks_that_disagree_or_misuse_the_runtime_are_refused_on_every_rank_alike():
    """One spawn, every case in turn (each refused on both ranks with the same line, so the
    next case starts in step): arguments that differ across ranks, a batch shaped unlike the
    other rank's on rank 0 only, a loss that is not a scalar; then
    ``timeout_s=3`` bounds the step's first collective although the default group waits 120 s."""
    from runtime_cases import misuse_run

    schedule = pipesched.build_schedule("1f1b", 2, 4)
    said, waited = spawn(misuse_run, 2, schedule, timeout_s=120)[0]
    same_arguments = "; every rank must build PipelineRuntime from the same arguments"
    assert said[:4] == [
        "the ranks disagree on block_counts: rank 0 has (2, 2), rank 1 has (3, 1)" + same_arguments,
        "the ranks disagree on seed: rank 0 has 0, rank 1 has 1" + same_arguments,
        "step 1: the ranks were given batches of different shapes (rank 0: inputs [2, 16] float32; context none; "
        "rank 1: inputs [2, 8] float32; context none): give every rank the same batch shapes (and the inputs on "
        "every rank when their shape changes)",
        "step 1: rank 1: the loss function returned a tensor of shape [2, 8], but the backward needs one number "
        "(reduce it, e.g. .mean())",
    ]
    assert said[4].startswith("rank 0 gave up waiting for every rank to start step 1: Timed out")
    assert 3 <= waited < 3 + 2
